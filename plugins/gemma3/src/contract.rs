//! The prepared-prefill contract, as `Gemma3Model.forward` merges and masks:
//!
//! - text: every token's embedding is scaled by `sqrt(hidden)` (the text model's scaled word
//!   embedding, applied to the whole prompt before the image rows are scattered in), so
//!   `text_scale` is exactly the decoder's own scale, on text-only prompts too;
//! - placements: the projected rows, unscaled, over the image soft tokens, item `i` taking the
//!   `i`-th run of `mm_tokens_per_image` of them (`masked_scatter` fills them in order);
//! - mask: causal, plus bidirectional attention inside each maximal run of soft tokens (the
//!   processor's `token_type_ids` are 1 on the soft tokens only, so `<start_of_image>` and
//!   `<end_of_image>` stay causal); sliding-window layers intersect this with their window,
//!   which the decoder does from the blocks;
//! - positions: plain 1-D `0..n`.

use mlxcel_plugin_api::{
    AttentionMask, ContractRequest, PluginError, Positions, PrefillProgram, ProgramPlacement, RVec,
};

use crate::config::Gemma3Config;
use crate::vision::FEATURES;

pub(crate) fn contract(config: &Gemma3Config, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
    let ids = request.token_ids.as_slice();
    let n = u32::try_from(ids.len()).map_err(|_| PluginError::too_large("the prompt is too long"))?;
    let soft = config.image_token_id;
    let per_image = config.mm_tokens_per_image as usize;

    // Maximal runs of soft tokens: the reference's bidirectional blocks.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (at, &id) in ids.iter().enumerate() {
        if id != soft {
            continue;
        }
        match runs.last_mut() {
            Some((start, len)) if *start + *len == at => *len += 1,
            _ => runs.push((at, 1)),
        }
    }
    let tokens: usize = runs.iter().map(|&(_, len)| len).sum();
    if tokens != per_image * request.items.len() {
        return Err(PluginError::invalid(format!(
            "the prompt has {tokens} image soft tokens; {} images need {}",
            request.items.len(),
            per_image * request.items.len()
        )));
    }

    // Item i takes soft tokens i * per_image .. (i + 1) * per_image in prompt order, which must
    // lie inside one run to be one placement.
    let mut placements = Vec::with_capacity(request.items.len());
    let mut run = runs.iter().copied();
    let mut current: Option<(usize, usize)> = None;
    for (index, item) in request.items.iter().enumerate() {
        if item.grid.feature_tokens != config.mm_tokens_per_image {
            return Err(PluginError::invalid(format!(
                "item {index} has {} feature rows; every gemma3 image has {per_image}",
                item.grid.feature_tokens
            )));
        }
        let (start, left) = match current.filter(|&(_, left)| left > 0) {
            Some(c) => c,
            None => run.next().ok_or_else(|| PluginError::invalid(format!("image {index} has no soft tokens")))?,
        };
        if left < per_image {
            return Err(PluginError::invalid(format!(
                "image {index}'s {per_image} soft tokens are not consecutive (a run of {left} starts at token {start})"
            )));
        }
        placements.push(ProgramPlacement::replace_span(index as u32, FEATURES, start as u32, per_image as u32));
        current = Some((start + per_image, left - per_image));
    }

    let mask = runs
        .iter()
        .fold(AttentionMask::causal(), |mask, &(start, len)| mask.with_bidirectional(start as u32, len as u32));
    Ok(PrefillProgram {
        text_scale: config.text_scale(),
        placements: placements.into(),
        positions: Positions::sequential(n),
        mask,
        injections: RVec::new(),
    })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, MediaGrid, Modality};

    use super::*;
    use crate::testing::{VARIANT_IMAGES, fixture_config, golden};

    fn items(count: usize, rows: u32) -> RVec<ItemMeta> {
        (0..count)
            .map(|_| ItemMeta {
                modality: Modality::Image,
                grid: MediaGrid { dims: vec![4, 4].into(), feature_tokens: rows },
            })
            .collect()
    }

    fn request(ids: Vec<u32>, images: usize) -> ContractRequest {
        ContractRequest { token_ids: ids.into(), items: items(images, 16) }
    }

    fn golden_ids(variant: &str) -> Vec<u32> {
        golden(variant).input_ids().expect("ids").iter().map(|&i| i as u32).collect()
    }

    #[test]
    fn positions_mask_and_placements_match_the_goldens() {
        let config = fixture_config();
        for (variant, images) in VARIANT_IMAGES {
            let golden = golden(variant);
            let ids = golden_ids(variant);
            let c = contract(&config, &request(ids.clone(), images)).expect("contract");
            assert_eq!(c.text_scale, 8.0, "{variant}: sqrt(64), on text-only prompts too");
            let Positions::OneD { ids: positions, next_position } = &c.positions else { panic!("1-D positions") };
            golden.check_i64("position_ids", positions).expect(variant);
            assert_eq!(*next_position, ids.len() as i64);
            let attends: Vec<i64> = c.mask.materialize(ids.len()).iter().map(|&v| i64::from(v == 0.0)).collect();
            golden.check_i64("attention_mask.full_attention", &attends).unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert_eq!(c.placements.len(), images, "{variant}");
            for (i, p) in c.placements.iter().enumerate() {
                assert_eq!((p.item, p.span().expect("a span").1, p.encoder_output.as_str()), (i as u32, 16, FEATURES));
                assert_eq!(
                    ids[p.span().expect("a span").0 as usize - 1],
                    config.boi_token_id,
                    "{variant}: the block opens before"
                );
                assert!(ids[p.span().expect("a span").0 as usize..][..16].iter().all(|&t| t == config.image_token_id));
                assert_eq!(ids[p.span().expect("a span").0 as usize + 16], config.eoi_token_id, "{variant}");
            }
        }
    }

    #[test]
    fn adjacent_images_share_one_block_as_the_reference_groups_them() {
        let config = fixture_config();
        let mut ids = vec![1, 390];
        ids.extend([392; 32]);
        ids.extend([391, 2]);
        let c = contract(&config, &request(ids, 2)).expect("contract");
        let starts: Vec<u32> = c.placements.iter().map(|p| p.span().expect("a span").0).collect();
        assert_eq!(starts, [2, 18]);
        assert_eq!(c.mask.blocks.len(), 1);
        assert_eq!((c.mask.blocks[0].row_start, c.mask.blocks[0].rows), (2, 32));
    }

    #[test]
    fn soft_tokens_that_disagree_with_the_images_are_refused() {
        let config = fixture_config();
        let err = contract(&config, &request(golden_ids("two_images"), 1)).expect_err("one image for two blocks");
        assert!(err.message.contains("32 image soft tokens; 1 images need 16"), "{err}");
        let err = contract(&config, &request(golden_ids("text_only"), 1)).expect_err("no soft tokens");
        assert!(err.message.contains("0 image soft tokens"), "{err}");
        let mut split = vec![392; 8];
        split.push(5);
        split.extend([392; 8]);
        let err = contract(&config, &request(split, 1)).expect_err("split run");
        assert!(err.message.contains("not consecutive"), "{err}");
        let wrong = ContractRequest { token_ids: golden_ids("image").into(), items: items(1, 9) };
        assert!(contract(&config, &wrong).is_err());
    }
}
