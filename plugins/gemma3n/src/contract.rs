//! The prepared-prefill contract, as `Gemma3nModel.forward` builds `inputs_embeds`:
//!
//! - text: the text model's scaled word embedding, `sqrt(hidden)` (so `text_scale` is the
//!   decoder's own scale, on text-only prompts too); `<start_of_audio>` is a text token;
//! - hard multimodal tokens: every id at or above the audio embedder's `vocab_offset` is
//!   embedded by `embed_audio` (its table row, `hard_embedding_norm`, the projection, the
//!   unscaled post-projection norm) and every id in the vision embedder's range by
//!   `embed_vision`, never by the text table. In a prompt laid out by the processor the only
//!   such tokens are the soft tokens (overwritten below) and each block's `<end_of_audio>`, whose
//!   row the encoder computes (`end_of_audio`) and the contract places over it. Any other hard
//!   token (a vision one, or an audio one outside a block) is refused: its row is not computed;
//! - placements: the encoder's `audio_features` over each clip's soft tokens, clip `i` taking
//!   the `i`-th run of `audio_soft_tokens_per_image` of them (`masked_scatter` fills them in
//!   order), unscaled;
//! - mask: causal only. Gemma 3n's audio tokens attend causally (unlike Gemma 3's image
//!   blocks); sliding-window layers intersect it with their window, which the decoder does;
//! - positions: plain 1-D `0..n`.

use mlxcel_plugin_api::{
    AttentionMask, ContractRequest, Modality, PluginError, Positions, PrefillProgram, ProgramPlacement, RVec,
};

use crate::audio::{END, FEATURES};
use crate::config::Gemma3nConfig;

pub(crate) fn contract(config: &Gemma3nConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
    let ids = request.token_ids.as_slice();
    let n = u32::try_from(ids.len()).map_err(|_| PluginError::too_large("the prompt is too long"))?;
    let soft = config.audio_token_id;
    let per_clip = config.audio_soft_tokens as usize;

    let tokens = ids.iter().filter(|&&t| t == soft).count();
    if tokens != per_clip * request.items.len() {
        return Err(PluginError::invalid(format!(
            "the prompt has {tokens} audio soft tokens; {} audio clips need {}",
            request.items.len(),
            per_clip * request.items.len()
        )));
    }

    let mut placements = Vec::with_capacity(2 * request.items.len());
    let mut placed_ends = Vec::with_capacity(request.items.len());
    let mut next = 0usize;
    for (index, item) in request.items.iter().enumerate() {
        if item.modality != Modality::Audio {
            return Err(PluginError::unsupported(format!(
                "item {index} is {}: gemma3n places audio only",
                item.modality.as_str()
            )));
        }
        if item.grid.feature_tokens != config.audio_soft_tokens {
            return Err(PluginError::invalid(format!(
                "item {index} has {} feature rows; every gemma3n clip has {per_clip}",
                item.grid.feature_tokens
            )));
        }
        let start = next + ids[next..].iter().position(|&t| t == soft).unwrap_or(0);
        let end = start + per_clip;
        if ids.get(start..end).is_none_or(|run| run.iter().any(|&t| t != soft)) {
            return Err(PluginError::invalid(format!(
                "audio clip {index}'s {per_clip} soft tokens are not consecutive (from token {start})"
            )));
        }
        if ids.get(end) != Some(&config.eoa_token_id) {
            return Err(PluginError::invalid(format!(
                "audio clip {index}'s soft tokens (from token {start}) are not followed by <end_of_audio> ({}), as the \
                 processor lays them out",
                config.eoa_token_id
            )));
        }
        placements.push(ProgramPlacement::replace_span(index as u32, FEATURES, start as u32, per_clip as u32));
        placements.push(ProgramPlacement::replace_span(index as u32, END, end as u32, 1));
        placed_ends.push(end);
        next = end;
    }

    // Every other hard multimodal token would need an embedder row this contract does not have.
    for (at, &id) in ids.iter().enumerate() {
        if id < config.vision_vocab_offset || id == soft || placed_ends.contains(&at) {
            continue;
        }
        let which = if id >= config.audio.vocab_offset { "audio" } else { "vision" };
        let what = if id == config.eoa_token_id {
            " (<end_of_audio> outside an audio block)".to_owned()
        } else {
            String::new()
        };
        return Err(PluginError::unsupported(format!(
            "token {at} is id {id}{what}, a hard {which} token the reference embeds with `embed_{which}`; gemma3n \
             computes that row only for each clip's own <end_of_audio>"
        )));
    }

    Ok(PrefillProgram {
        text_scale: config.text_scale(),
        placements: placements.into(),
        positions: Positions::sequential(n),
        mask: AttentionMask::causal(),
        injections: RVec::new(),
    })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, MediaGrid};

    use super::*;
    use crate::testing::{VARIANT_CLIPS, fixture_config, golden};

    fn request(ids: Vec<u32>, clips: usize) -> ContractRequest {
        let items = (0..clips)
            .map(|_| ItemMeta {
                modality: Modality::Audio,
                grid: MediaGrid { dims: vec![97].into(), feature_tokens: 8 },
            })
            .collect();
        ContractRequest { token_ids: ids.into(), items }
    }

    fn golden_ids(variant: &str) -> Vec<u32> {
        golden(variant).input_ids().expect("ids").iter().map(|&i| i as u32).collect()
    }

    #[test]
    fn positions_mask_and_placements_match_the_goldens() {
        let config = fixture_config();
        for (variant, clips) in VARIANT_CLIPS {
            let golden = golden(variant);
            let ids = golden_ids(variant);
            let c = contract(&config, &request(ids.clone(), clips)).expect("contract");
            assert_eq!(c.text_scale, 8.0, "{variant}: sqrt(64), on text-only prompts too");
            let Positions::OneD { ids: positions, next_position } = &c.positions else { panic!("1-D positions") };
            golden.check_i64("position_ids", positions).expect(variant);
            assert_eq!(*next_position, ids.len() as i64);
            let attends: Vec<i64> = c.mask.materialize(ids.len()).iter().map(|&v| i64::from(v == 0.0)).collect();
            golden.check_i64("attention_mask.full_attention", &attends).unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert_eq!(c.placements.len(), 2 * clips, "{variant}");
            for (i, pair) in c.placements.chunks(2).enumerate() {
                let (start, len) = pair[0].span().expect("span");
                assert_eq!((pair[0].item, len, pair[0].encoder_output.as_str()), (i as u32, 8, FEATURES));
                assert_eq!(ids[start as usize - 1], config.boa_token_id, "{variant}");
                assert!(ids[start as usize..][..8].iter().all(|&t| t == config.audio_token_id), "{variant}");
                assert_eq!(
                    (pair[1].item, pair[1].span(), pair[1].encoder_output.as_str()),
                    (i as u32, Some((start + 8, 1)), END)
                );
                assert_eq!(ids[start as usize + 8], config.eoa_token_id, "{variant}");
            }
        }
    }

    #[test]
    fn tokens_that_disagree_with_the_clips_are_refused() {
        let config = fixture_config();
        let err = contract(&config, &request(golden_ids("two_audios"), 1)).expect_err("one clip for two blocks");
        assert!(err.message.contains("16 audio soft tokens; 1 audio clips need 8"), "{err}");
        let err = contract(&config, &request(golden_ids("text_only"), 1)).expect_err("no soft tokens");
        assert!(err.message.contains("0 audio soft tokens"), "{err}");
        let mut split = vec![391, 401, 401, 401, 401, 5];
        split.extend([401, 401, 401, 401, 400]);
        let err = contract(&config, &request(split, 1)).expect_err("split run");
        assert!(err.message.contains("not consecutive"), "{err}");
        let mut open = vec![391];
        open.extend([401; 8]);
        open.push(5);
        let err = contract(&config, &request(open, 1)).expect_err("no eoa");
        assert!(err.message.contains("not followed by <end_of_audio> (400)"), "{err}");
        // A hard token the plugin has no row for: vision's <end_of_image>, a stray <end_of_audio>.
        let mut ids = golden_ids("audio");
        ids.insert(1, 392);
        let err = contract(&config, &request(ids, 1)).expect_err("vision");
        assert_eq!(err.code, mlxcel_plugin_api::ErrorCode::Unsupported);
        assert!(err.message.contains("token 1 is id 392, a hard vision token"), "{err}");
        let err = contract(&config, &request(vec![2, 400, 3], 0)).expect_err("stray eoa");
        assert!(err.message.contains("token 1 is id 400 (<end_of_audio> outside an audio block)"), "{err}");
    }
}
