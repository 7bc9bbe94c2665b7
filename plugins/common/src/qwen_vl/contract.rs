//! The prepared-prefill contract: each image's features replace its run of `<|image_pad|>`
//! tokens, the mask is causal, and positions are M-RoPE (`get_rope_index`): text advances all
//! three rows by one per token; an image's tokens take `(t, h, w)` = the running position
//! plus their (frame, merged row, merged column), and the text after it continues from the
//! image's largest position plus one. Decode continues from the largest position plus one,
//! so `rope_delta = next_position - len`. A prompt without images has plain 1-D positions,
//! as the reference gives it.
//!
//! What the families vary on is [`Layout`]: how the M-RoPE sections lie over the rotary
//! dimensions, and which encoder outputs are also added to the early decoder layers' outputs at
//! the image tokens (Qwen3-VL's DeepStack).

use mlxcel_plugin_api::{
    AttentionMask, ContractRequest, PluginError, Positions, PrefillProgram, ProgramInjection, ProgramPlacement, RVec,
};

use super::QwenVl;
use super::prompt::feature_tokens;
use super::vision::FEATURES;

/// A family's contract beyond the shared one.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// The M-RoPE sections interleave over the rotary dimensions (t, h, w, t, h, w, ...: Qwen3-VL)
    /// instead of following each other.
    pub interleaved: bool,
    /// Encoder outputs added, at each image's tokens, to the outputs of decoder layers 0, 1, ...
    /// in this order (Qwen3-VL's DeepStack features).
    pub injected: Vec<String>,
}

pub fn contract(config: &QwenVl, request: &ContractRequest, layout: &Layout) -> Result<PrefillProgram, PluginError> {
    let ids = request.token_ids.as_slice();
    let len = ids.len();
    let pad = config.image_token_id;
    let mask = AttentionMask::causal();
    if request.items.is_empty() {
        if let Some(at) = ids.iter().position(|&t| t == pad) {
            return Err(PluginError::invalid(format!("token {at} is an image pad but the request has no images")));
        }
        let n = u32::try_from(len).map_err(|_| PluginError::too_large("the prompt is too long"))?;
        return Ok(PrefillProgram {
            text_scale: 1.0,
            placements: RVec::new(),
            positions: Positions::sequential(n),
            mask,
            injections: RVec::new(),
        });
    }

    let merge = config.geometry.spatial_merge_size as u32;
    let mut rows: [Vec<i64>; 3] = [Vec::with_capacity(len), Vec::with_capacity(len), Vec::with_capacity(len)];
    let mut placements = Vec::with_capacity(request.items.len());
    let mut injections = Vec::with_capacity(request.items.len() * layout.injected.len());
    let mut next: i64 = 0;
    let mut at = 0usize;
    let mut items = request.items.iter().enumerate();
    while at < len {
        if ids[at] != pad {
            for row in &mut rows {
                row.push(next);
            }
            next += 1;
            at += 1;
            continue;
        }
        let Some((index, item)) = items.next() else {
            return Err(PluginError::invalid(format!("token {at} starts an image run but every image is placed")));
        };
        let count = feature_tokens(config, &item.grid)? as usize;
        let end = at + count;
        if end > len || ids[at..end].iter().any(|&t| t != pad) || ids.get(end) == Some(&pad) {
            return Err(PluginError::invalid(format!(
                "image {index} needs a run of exactly {count} image tokens at token {at}"
            )));
        }
        let (t, h, w) = (item.grid.dims[0], item.grid.dims[1] / merge, item.grid.dims[2] / merge);
        for frame in 0..t {
            for y in 0..h {
                for x in 0..w {
                    rows[0].push(next + i64::from(frame));
                    rows[1].push(next + i64::from(y));
                    rows[2].push(next + i64::from(x));
                }
            }
        }
        // The reference advances by the larger merged side (images have one frame).
        next += i64::from(h.max(w));
        placements.push(ProgramPlacement::replace_span(index as u32, FEATURES, at as u32, count as u32));
        let tokens = placements[placements.len() - 1].tokens.clone();
        injections.extend(layout.injected.iter().enumerate().map(|(layer, output)| ProgramInjection {
            item: index as u32,
            decoder_layer: layer as u32,
            encoder_output: output.as_str().into(),
            tokens: tokens.clone(),
        }));
        at = end;
    }
    if let Some((index, _)) = items.next() {
        return Err(PluginError::invalid(format!("image {index} has no run of image tokens in the prompt")));
    }
    let ids: RVec<i64> = rows.into_iter().flatten().collect();
    Ok(PrefillProgram {
        text_scale: 1.0,
        placements: placements.into(),
        positions: Positions::MRope {
            ids,
            sections: config.mrope_section.iter().copied().collect(),
            interleaved: layout.interleaved,
            next_position: next,
        },
        mask,
        injections: injections.into(),
    })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, Modality};

    use super::*;
    use crate::qwen_vl::testing::{FIXTURES, VARIANTS, fixture_config, golden, grid, grids};

    fn request(name: &str, variant: &str, grids: &[[u32; 3]]) -> ContractRequest {
        let config = fixture_config(name);
        let ids = golden(name, variant).input_ids().expect("ids");
        ContractRequest {
            token_ids: ids.iter().map(|&i| i as u32).collect(),
            items: grids.iter().map(|&g| ItemMeta { modality: Modality::Image, grid: grid(&config, g) }).collect(),
        }
    }

    #[test]
    fn positions_and_rope_delta_match_the_goldens() {
        for name in FIXTURES {
            let config = fixture_config(name);
            for variant in VARIANTS {
                let golden = golden(name, variant);
                let request = request(name, variant, &grids(name, variant));
                let c = contract(&config, &request, &Layout::default()).expect("contract");
                let (ids, next) = match &c.positions {
                    Positions::OneD { ids, next_position } => (ids.to_vec(), *next_position),
                    Positions::MRope { ids, sections, interleaved, next_position } => {
                        assert_eq!(sections.as_slice(), config.mrope_section.as_slice());
                        assert!(!interleaved, "the default layout");
                        (ids.to_vec(), *next_position)
                    }
                };
                golden.check_i64("position_ids", &ids).expect(variant);
                let delta = golden.field("rope_delta").expect("rope_delta").as_i64().expect("integer");
                assert_eq!(next - request.token_ids.len() as i64, delta, "{name}/{variant}");
                let pads = request.token_ids.iter().filter(|&&t| t == config.image_token_id).count() as u32;
                assert_eq!(c.placements.iter().map(|p| p.span().expect("a span").1).sum::<u32>(), pads, "{variant}");
                assert_eq!(c.mask, AttentionMask::causal());
            }
        }
    }

    #[test]
    fn image_runs_that_disagree_with_the_grids_are_refused() {
        let config = fixture_config("qwen2_vl");
        let run = |variant: &str, grids: &[[u32; 3]]| {
            contract(&config, &request("qwen2_vl", variant, grids), &Layout::default())
        };
        // One grid too few, one too many, and a grid whose run is shorter than the prompt's.
        let err = run("two_images", &[[1, 4, 8]]).expect_err("missing grid");
        assert!(err.message.contains("every image is placed"), "{err}");
        let err = run("image", &[[1, 4, 8], [1, 2, 2]]).expect_err("extra grid");
        assert_eq!(err.message.as_str(), "image 1 has no run of image tokens in the prompt");
        let err = run("image", &[[1, 4, 4]]).expect_err("short grid");
        assert!(err.message.contains("exactly 4 image tokens"), "{err}");
    }
}
