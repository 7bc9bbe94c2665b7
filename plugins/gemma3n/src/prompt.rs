//! Placeholder expansion, as `Gemma3nProcessor` does it: the chat template renders
//! `<audio_soft_token>` once per clip, and the i-th one becomes the clip's whole block,
//! `"\n\n<start_of_audio>" + "<audio_soft_token>" * audio_soft_tokens_per_image +
//! "<end_of_audio>\n\n"` (`full_audio_sequence`). Every clip has the same block, whatever its
//! length: the rows it does not fill carry the padding embedding (see `audio.rs`).

use mlxcel_plugin_api::{ItemLayout, LayoutRequest, Modality, PluginError, PromptLayout};

use crate::config::Gemma3nConfig;

/// The placeholder the chat template renders, and the soft token of the block (the
/// tokenizer's `audio_token`).
pub(crate) const SOFT: &str = "<audio_soft_token>";
/// The block's opener (the tokenizer's `boa_token`).
pub(crate) const BOA: &str = "<start_of_audio>";
/// The block's closer (the tokenizer's `eoa_token`).
pub(crate) const EOA: &str = "<end_of_audio>";

/// One clip's block: `Gemma3nProcessor.full_audio_sequence`.
pub(crate) fn audio_block(config: &Gemma3nConfig) -> String {
    format!("\n\n{BOA}{}{EOA}\n\n", SOFT.repeat(config.audio_soft_tokens as usize))
}

/// Replaces the `i`-th `<audio_soft_token>` with clip `i`'s block.
pub(crate) fn layout(config: &Gemma3nConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
    let prompt = request.prompt.as_str();
    let placeholders = prompt.matches(SOFT).count();
    if placeholders != request.items.len() {
        return Err(PluginError::invalid(format!(
            "the prompt has {placeholders} {SOFT} placeholders for {} audio clips",
            request.items.len()
        )));
    }
    let block = audio_block(config);
    let mut parts = prompt.split(SOFT);
    let mut text = parts.next().unwrap_or_default().to_owned();
    let mut items = Vec::with_capacity(request.items.len());
    for (index, (item, rest)) in request.items.iter().zip(parts).enumerate() {
        if item.modality != Modality::Audio {
            return Err(PluginError::unsupported(format!(
                "item {index} is {}: gemma3n lays out audio only",
                item.modality.as_str()
            )));
        }
        if item.grid.feature_tokens != config.audio_soft_tokens {
            return Err(PluginError::invalid(format!(
                "item {index} has {} feature rows; every gemma3n clip has {}",
                item.grid.feature_tokens, config.audio_soft_tokens
            )));
        }
        text.push_str(&block);
        text.push_str(rest);
        items.push(ItemLayout {
            feature_token_id: config.audio_token_id,
            feature_tokens: config.audio_soft_tokens,
            expansion: block.as_str().into(),
        });
    }
    Ok(PromptLayout { text: text.into(), items: items.into() })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, MediaGrid, RVec};

    use super::*;
    use crate::testing::{VARIANT_CLIPS, fixture_config, golden};

    fn request(prompt: &str, clips: usize) -> LayoutRequest {
        let grid = MediaGrid { dims: vec![97].into(), feature_tokens: 8 };
        let items: RVec<ItemMeta> =
            (0..clips).map(|_| ItemMeta { modality: Modality::Audio, grid: grid.clone() }).collect();
        LayoutRequest { prompt: prompt.into(), items }
    }

    #[test]
    fn each_placeholder_becomes_the_processors_block() {
        let config = fixture_config();
        let layout = layout(&config, &request("a<audio_soft_token>b", 1)).expect("layout");
        let soft = "<audio_soft_token>".repeat(8);
        let block = format!("\n\n<start_of_audio>{soft}<end_of_audio>\n\n");
        assert_eq!(layout.text.as_str(), format!("a{block}b"));
        let item = &layout.items[0];
        assert_eq!((item.feature_token_id, item.feature_tokens, item.expansion.as_str()), (401, 8, block.as_str()));
    }

    /// The golden prompts expand to the golden `input_ids`: checked here on the ids' structure
    /// (the tokenizer is the host's), `plugins verify` checks them token by token.
    #[test]
    fn the_expansion_lays_out_the_goldens_input_ids() {
        let config = fixture_config();
        for (variant, clips) in VARIANT_CLIPS {
            let golden = golden(variant);
            let prompt = golden.prompt().expect("prompt");
            let layout = layout(&config, &request(prompt, clips)).expect("layout");
            let ids = golden.input_ids().expect("ids");
            let id = |t: u32| i64::from(t);
            let count = |t: u32| ids.iter().filter(|&&x| x == id(t)).count();
            assert_eq!(count(config.audio_token_id), 8 * clips, "{variant}");
            assert_eq!((count(config.boa_token_id), count(config.eoa_token_id)), (clips, clips), "{variant}");
            assert_eq!(layout.text.matches(SOFT).count(), 8 * clips, "{variant}");
            // Each block in the ids: "\n\n" (198, 198), boa, 8 soft tokens, eoa, "\n\n".
            for (at, _) in ids.iter().enumerate().filter(|(_, t)| **t == id(config.boa_token_id)) {
                assert_eq!(&ids[at - 2..at], &[198, 198], "{variant}");
                assert!(ids[at + 1..at + 9].iter().all(|&t| t == id(config.audio_token_id)), "{variant}");
                assert_eq!(ids[at + 9], id(config.eoa_token_id), "{variant}");
                assert_eq!(&ids[at + 10..at + 12], &[198, 198], "{variant}");
            }
            assert_eq!(layout.text.replace(&audio_block(&config), SOFT), prompt, "{variant}: only the blocks change");
        }
    }

    #[test]
    fn placeholder_and_clip_counts_must_agree() {
        let config = fixture_config();
        let err = layout(&config, &request("<audio_soft_token><audio_soft_token>", 1)).expect_err("two for one");
        assert_eq!(err.message.as_str(), "the prompt has 2 <audio_soft_token> placeholders for 1 audio clips");
        assert!(layout(&config, &request("no audio", 1)).is_err());
        let mut image = request("<audio_soft_token>", 1);
        image.items =
            vec![ItemMeta { modality: Modality::Image, grid: MediaGrid { dims: vec![].into(), feature_tokens: 8 } }]
                .into();
        assert_eq!(layout(&config, &image).expect_err("image").code, mlxcel_plugin_api::ErrorCode::Unsupported);
    }
}
