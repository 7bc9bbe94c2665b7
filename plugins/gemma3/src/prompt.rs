//! Placeholder expansion, as `Gemma3Processor` does it: the chat template renders
//! `<start_of_image>` once per image, and the i-th one becomes the image's whole block,
//! `"\n\n<start_of_image>" + "<image_soft_token>" * mm_tokens_per_image + "<end_of_image>\n\n"`.
//! The wrapper (two newlines, the begin and end tokens, two newlines) is part of the expansion,
//! so the host's token count (and its capacity check) includes every wrapper token.

use mlxcel_plugin_api::{ItemLayout, LayoutRequest, Modality, PluginError, PromptLayout};

use crate::config::Gemma3Config;

/// The placeholder the chat template renders (the tokenizer's `boi_token`).
pub(crate) const BOI: &str = "<start_of_image>";
/// The soft token each projected row replaces (the tokenizer's `image_token`).
pub(crate) const SOFT: &str = "<image_soft_token>";
/// The block's closing token (the tokenizer's `eoi_token`).
pub(crate) const EOI: &str = "<end_of_image>";

/// One image's block: `Gemma3Processor.full_image_sequence`.
pub(crate) fn image_block(config: &Gemma3Config) -> String {
    format!("\n\n{BOI}{}{EOI}\n\n", SOFT.repeat(config.mm_tokens_per_image as usize))
}

/// Replaces the `i`-th `<start_of_image>` with item `i`'s block.
pub(crate) fn layout(config: &Gemma3Config, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
    let prompt = request.prompt.as_str();
    let placeholders = prompt.matches(BOI).count();
    if placeholders != request.items.len() {
        return Err(PluginError::invalid(format!(
            "the prompt has {placeholders} {BOI} placeholders for {} images",
            request.items.len()
        )));
    }
    let block = image_block(config);
    let mut parts = prompt.split(BOI);
    let mut text = parts.next().unwrap_or_default().to_owned();
    let mut items = Vec::with_capacity(request.items.len());
    for (index, (item, rest)) in request.items.iter().zip(parts).enumerate() {
        if item.modality != Modality::Image {
            return Err(PluginError::unsupported(format!("item {index}: gemma3 lays out images only")));
        }
        if item.grid.feature_tokens != config.mm_tokens_per_image {
            return Err(PluginError::invalid(format!(
                "item {index} has {} feature rows; every gemma3 image has {}",
                item.grid.feature_tokens, config.mm_tokens_per_image
            )));
        }
        text.push_str(&block);
        text.push_str(rest);
        items.push(ItemLayout {
            feature_token_id: config.image_token_id,
            feature_tokens: config.mm_tokens_per_image,
            expansion: block.as_str().into(),
        });
    }
    Ok(PromptLayout { text: text.into(), items: items.into() })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, MediaGrid, RVec};

    use super::*;
    use crate::testing::{VARIANT_IMAGES, fixture_config, golden};

    fn request(prompt: &str, images: usize) -> LayoutRequest {
        let grid = MediaGrid { dims: vec![4, 4].into(), feature_tokens: 16 };
        let items: RVec<ItemMeta> =
            (0..images).map(|_| ItemMeta { modality: Modality::Image, grid: grid.clone() }).collect();
        LayoutRequest { prompt: prompt.into(), items }
    }

    #[test]
    fn each_placeholder_becomes_the_processors_block() {
        let config = fixture_config();
        let layout = layout(&config, &request("a<start_of_image>b", 1)).expect("layout");
        let soft = "<image_soft_token>".repeat(16);
        assert_eq!(layout.text.as_str(), format!("a\n\n<start_of_image>{soft}<end_of_image>\n\nb"));
        assert_eq!(layout.items.len(), 1);
        let item = &layout.items[0];
        assert_eq!((item.feature_token_id, item.feature_tokens), (392, 16));
        assert_eq!(item.expansion.as_str(), format!("\n\n<start_of_image>{soft}<end_of_image>\n\n"));
    }

    /// The expanded golden prompts, tokenized, are the golden `input_ids`: the host's tokenizer
    /// is not available here, so the test rebuilds the ids from the expansion's structure (the
    /// soft, begin and end tokens and the newlines around them) and checks them against the
    /// golden's, with the text between taken from the golden.
    #[test]
    fn the_expansion_lays_out_the_goldens_input_ids() {
        let config = fixture_config();
        for (variant, images) in VARIANT_IMAGES {
            let golden = golden(variant);
            let prompt = golden.prompt().expect("prompt");
            let layout = layout(&config, &request(prompt, images)).expect("layout");
            let ids = golden.input_ids().expect("ids");
            let count = |id: u32| ids.iter().filter(|&&t| t == i64::from(id)).count();
            assert_eq!(count(config.image_token_id), 16 * images, "{variant}: soft tokens");
            assert_eq!((count(config.boi_token_id), count(config.eoi_token_id)), (images, images), "{variant}");
            assert_eq!(layout.text.matches(SOFT).count(), 16 * images, "{variant}");
            // Each block in the ids: boi, 16 soft tokens, eoi, with "\n\n" (198, 198) on each side.
            for (at, _) in ids.iter().enumerate().filter(|(_, t)| **t == i64::from(config.boi_token_id)) {
                assert_eq!(&ids[at - 2..at], &[198, 198], "{variant}: newlines before the block");
                assert!(ids[at + 1..at + 17].iter().all(|&t| t == i64::from(config.image_token_id)), "{variant}");
                assert_eq!(ids[at + 17], i64::from(config.eoi_token_id), "{variant}");
                assert_eq!(&ids[at + 18..at + 20], &[198, 198], "{variant}: newlines after the block");
            }
            assert_eq!(layout.text.replace(&image_block(&config), BOI), prompt, "{variant}: only the blocks change");
        }
    }

    #[test]
    fn placeholder_and_image_counts_must_agree() {
        let config = fixture_config();
        let two = "<start_of_image><start_of_image>";
        let err = layout(&config, &request(two, 1)).expect_err("one image for two placeholders");
        assert_eq!(err.message.as_str(), "the prompt has 2 <start_of_image> placeholders for 1 images");
        let err = layout(&config, &request("no image", 1)).expect_err("no placeholder");
        assert!(err.message.contains("0 <start_of_image> placeholders"), "{err}");
        let mut wrong = request("<start_of_image>", 1);
        wrong.items = vec![ItemMeta {
            modality: Modality::Image,
            grid: MediaGrid { dims: vec![3, 3].into(), feature_tokens: 9 },
        }]
        .into();
        assert!(layout(&config, &wrong).is_err());
    }
}
