//! The prepared-prefill contract, as `LlavaModel.forward` merges: the projector's rows replace
//! the image tokens in order (`masked_scatter`), so image `i` takes the `i`-th run of
//! `feature_tokens` image tokens (adjacent placeholders make one longer run, split in order);
//! text embeddings unscaled; 1-D positions `0..n` and a causal mask, as the Llama decoder
//! has them.

use mlxcel_plugin_api::{
    AttentionMask, ContractRequest, PluginError, Positions, PrefillProgram, ProgramPlacement, RVec,
};

use crate::config::LlavaConfig;
use crate::vision::FEATURES;

pub(crate) fn contract(config: &LlavaConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
    let ids = request.token_ids.as_slice();
    let len = u32::try_from(ids.len()).map_err(|_| PluginError::too_large("the prompt is too long"))?;
    let token = config.image_token_id;
    let positions: Vec<usize> = ids.iter().enumerate().filter(|&(_, &t)| t == token).map(|(i, _)| i).collect();
    let want: u64 = request.items.iter().map(|i| u64::from(i.grid.feature_tokens)).sum();
    if positions.len() as u64 != want {
        return Err(PluginError::invalid(format!(
            "the prompt has {} image tokens; its {} images have {want} feature rows",
            positions.len(),
            request.items.len()
        )));
    }
    let mut placements = Vec::with_capacity(request.items.len());
    let mut taken = 0usize;
    for (index, item) in request.items.iter().enumerate() {
        let rows = item.grid.feature_tokens as usize;
        if rows == 0 {
            return Err(PluginError::invalid(format!("image {index} has no feature rows")));
        }
        let own = &positions[taken..taken + rows];
        let start = own[0];
        if own[rows - 1] != start + rows - 1 {
            return Err(PluginError::invalid(format!(
                "image {index}'s {rows} image tokens are not consecutive (from token {start})"
            )));
        }
        placements.push(ProgramPlacement::replace_span(index as u32, FEATURES, start as u32, rows as u32));
        taken += rows;
    }
    Ok(PrefillProgram {
        text_scale: 1.0,
        placements: placements.into(),
        positions: Positions::sequential(len),
        mask: AttentionMask::causal(),
        injections: RVec::new(),
    })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, MediaGrid, Modality};

    use super::*;
    use crate::testing::{VARIANT_IMAGES, fixture_config, golden};

    fn request(ids: Vec<u32>, images: usize, rows: u32) -> ContractRequest {
        let grid = MediaGrid { dims: vec![4, 4].into(), feature_tokens: rows };
        ContractRequest {
            token_ids: ids.into(),
            items: (0..images).map(|_| ItemMeta { modality: Modality::Image, grid: grid.clone() }).collect(),
        }
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
            let c = contract(&config, &request(ids.clone(), images, 16)).expect("contract");
            let Positions::OneD { ids: pos, next_position } = &c.positions else { panic!("1-D positions") };
            golden.check_i64("position_ids", pos).expect(variant);
            assert_eq!(*next_position, ids.len() as i64);
            assert_eq!((c.text_scale, &c.mask), (1.0, &AttentionMask::causal()));
            // Every image token is covered once, in order.
            let mut covered = vec![false; ids.len()];
            for (i, p) in c.placements.iter().enumerate() {
                assert_eq!(
                    (p.item as usize, p.span().expect("a span").1, p.encoder_output.as_str()),
                    (i, 16, FEATURES)
                );
                for slot in &mut covered[p.span().expect("a span").0 as usize
                    ..(p.span().expect("a span").0 + p.span().expect("a span").1) as usize]
                {
                    *slot = true;
                }
            }
            let tokens: Vec<bool> = ids.iter().map(|&t| t == config.image_token_id).collect();
            assert_eq!(covered, tokens, "{variant}");
        }
    }

    #[test]
    fn adjacent_placeholders_split_in_order() {
        let config = fixture_config();
        let t = config.image_token_id;
        let mut ids = vec![1, 2];
        ids.extend([t; 32]);
        ids.push(3);
        let c = contract(&config, &request(ids, 2, 16)).expect("contract");
        let starts: Vec<(u32, u32)> =
            c.placements.iter().map(|p| (p.span().expect("a span").0, p.span().expect("a span").1)).collect();
        assert_eq!(starts, [(2, 16), (18, 16)]);
    }

    #[test]
    fn image_tokens_that_disagree_with_the_images_are_refused() {
        let config = fixture_config();
        let err = contract(&config, &request(golden_ids("two_images"), 1, 16)).expect_err("one image");
        assert_eq!(err.message.as_str(), "the prompt has 32 image tokens; its 1 images have 16 feature rows");
        let err = contract(&config, &request(golden_ids("text_only"), 1, 16)).expect_err("no tokens");
        assert!(err.message.starts_with("the prompt has 0 image tokens"), "{err}");
        let t = config.image_token_id;
        let mut split = vec![t; 8];
        split.push(5);
        split.extend([t; 8]);
        let err = contract(&config, &request(split, 1, 16)).expect_err("split");
        assert_eq!(err.message.as_str(), "image 0's 16 image tokens are not consecutive (from token 0)");
    }
}
