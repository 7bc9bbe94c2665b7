//! The prepared-prefill contract, as `LlavaModel.forward` merges: the projector's rows replace
//! the image tokens in order (`masked_scatter`), so image `i` takes the `i`-th run of
//! `feature_tokens` image tokens (adjacent placeholders make one longer run, split in order);
//! text embeddings unscaled; 1-D positions `0..n` and a causal mask, as the Llama decoder
//! has them.

use mlxcel_plugin_api::{ContractRequest, PluginError, PrefillProgram};

use crate::config::LlavaConfig;
use crate::vision::FEATURES;

pub(crate) fn contract(config: &LlavaConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
    mlxcel_family_common::contract::replace_in_order(request, config.image_token_id, FEATURES)
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{AttentionMask, ItemMeta, MediaGrid, Modality, Positions};

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
