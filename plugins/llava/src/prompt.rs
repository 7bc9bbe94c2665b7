//! Placeholder expansion: the chat template renders `<image>` once per image, and
//! `LlavaProcessor` repeats it once per feature row: the tower's `(S / patch)^2` patches, plus
//! the class token under the `full` strategy (`num_additional_image_tokens` is the class
//! token, which `default` drops again).

use mlxcel_plugin_api::{ItemLayout, LayoutRequest, Modality, PluginError, PromptLayout};

use crate::config::LlavaConfig;

/// Replaces the `i`-th placeholder with item `i`'s run of image tokens.
pub(crate) fn layout(config: &LlavaConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
    let token = config.image_token.as_str();
    let prompt = request.prompt.as_str();
    let placeholders = prompt.matches(token).count();
    if placeholders != request.items.len() {
        return Err(PluginError::invalid(format!(
            "the prompt has {placeholders} {token} placeholders for {} images",
            request.items.len()
        )));
    }
    let n = config.feature_tokens();
    let mut parts = prompt.split(token);
    let mut text = parts.next().unwrap_or_default().to_owned();
    let mut items = Vec::with_capacity(request.items.len());
    for (index, (item, rest)) in request.items.iter().zip(parts).enumerate() {
        if item.modality != Modality::Image {
            return Err(PluginError::unsupported(format!("item {index}: llava lays out images only")));
        }
        if item.grid.feature_tokens != n {
            return Err(PluginError::invalid(format!(
                "item {index} has {} feature tokens; every llava image has {n}",
                item.grid.feature_tokens
            )));
        }
        let expansion = token.repeat(n as usize);
        text.push_str(&expansion);
        text.push_str(rest);
        items.push(ItemLayout {
            feature_token_id: config.image_token_id,
            feature_tokens: n,
            expansion: expansion.into(),
        });
    }
    Ok(PromptLayout { text: text.into(), items: items.into() })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, MediaGrid, RVec};

    use super::*;
    use crate::config::SelectStrategy;
    use crate::testing::{VARIANT_IMAGES, fixture_config, golden};

    fn request(config: &LlavaConfig, prompt: &str, images: usize) -> LayoutRequest {
        let grid = MediaGrid { dims: vec![4, 4].into(), feature_tokens: config.feature_tokens() };
        let items: RVec<ItemMeta> =
            (0..images).map(|_| ItemMeta { modality: Modality::Image, grid: grid.clone() }).collect();
        LayoutRequest { prompt: prompt.into(), items }
    }

    /// The lengths of the runs of `token` in `ids`.
    fn runs(ids: &[i64], token: i64) -> Vec<usize> {
        let mut runs = Vec::new();
        let mut run = 0;
        for &id in ids.iter().chain(std::iter::once(&-1)) {
            if id == token {
                run += 1;
            } else if run > 0 {
                runs.push(run);
                run = 0;
            }
        }
        runs
    }

    #[test]
    fn each_placeholder_expands_to_the_goldens_run_of_image_tokens() {
        let config = fixture_config();
        for (variant, images) in VARIANT_IMAGES {
            let golden = golden(variant);
            let prompt = golden.prompt().expect("prompt");
            let layout = layout(&config, &request(&config, prompt, images)).expect("layout");
            let ids = golden.input_ids().expect("ids");
            let counts: Vec<usize> = layout.items.iter().map(|i| i.feature_tokens as usize).collect();
            assert_eq!(counts, runs(&ids, i64::from(config.image_token_id)), "{variant}");
            assert_eq!(layout.text.matches("<image>").count(), 16 * images, "{variant}");
            assert_eq!(layout.text.replace("<image>", ""), prompt.replace("<image>", ""), "{variant}");
        }
    }

    #[test]
    fn the_full_strategy_adds_the_class_tokens_row() {
        let mut config = fixture_config();
        config.select = SelectStrategy::Full;
        let layout = layout(&config, &request(&config, "USER: <image>\nHi", 1)).expect("layout");
        assert_eq!(layout.items[0].feature_tokens, 17);
        assert_eq!(layout.text.as_str(), format!("USER: {}\nHi", "<image>".repeat(17)));
    }

    #[test]
    fn placeholder_and_image_counts_must_agree() {
        let config = fixture_config();
        let err = layout(&config, &request(&config, "<image>\n<image>\n", 1)).expect_err("two for one");
        assert_eq!(err.message.as_str(), "the prompt has 2 <image> placeholders for 1 images");
        let err = layout(&config, &request(&config, "no image", 1)).expect_err("none");
        assert!(err.message.contains("0 <image> placeholders"), "{err}");
        let mut bad = request(&config, "<image>", 1);
        bad.items[0].grid.feature_tokens = 17;
        let err = layout(&config, &bad).expect_err("a grid from another config");
        assert_eq!(err.message.as_str(), "item 0 has 17 feature tokens; every llava image has 16");
    }
}
