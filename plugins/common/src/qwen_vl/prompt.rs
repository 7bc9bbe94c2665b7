//! Placeholder expansion: the chat template renders `<|vision_start|><|image_pad|><|vision_end|>`
//! once per image, and each `<|image_pad|>` becomes `t * h * w / merge^2` of them (the
//! reference processor's `image_token * num_image_tokens`), in item order.

use mlxcel_plugin_api::{ItemLayout, LayoutRequest, MediaGrid, Modality, PluginError, PromptLayout};

use super::PatchRows;

/// The image placeholder token's text.
pub const IMAGE_PAD: &str = "<|image_pad|>";

/// The feature rows (and pad tokens) of an item with grid `(t, h, w)` in patches.
pub fn feature_tokens(config: &impl PatchRows, grid: &MediaGrid) -> Result<u32, PluginError> {
    let dims = grid.dims.as_slice();
    let &[t, h, w] = dims else {
        return Err(PluginError::invalid(format!("a qwen-vl grid is (t, h, w), got {dims:?}")));
    };
    let merge = config.geometry().spatial_merge_size as u32;
    if h % merge != 0 || w % merge != 0 {
        return Err(PluginError::invalid(format!("grid {h}x{w} is not a multiple of the merge size {merge}")));
    }
    t.checked_mul(h / merge)
        .and_then(|n| n.checked_mul(w / merge))
        .ok_or_else(|| PluginError::too_large(format!("grid {t}x{h}x{w} overflows")))
}

/// Replaces the `i`-th `<|image_pad|>` with item `i`'s run of pad tokens.
pub fn layout(config: &impl PatchRows, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
    let prompt = request.prompt.as_str();
    let placeholders = prompt.matches(IMAGE_PAD).count();
    if placeholders != request.items.len() {
        return Err(PluginError::invalid(format!(
            "the prompt has {placeholders} {IMAGE_PAD} placeholders for {} images",
            request.items.len()
        )));
    }
    let mut parts = prompt.split(IMAGE_PAD);
    let mut text = parts.next().unwrap_or_default().to_owned();
    let mut items = Vec::with_capacity(request.items.len());
    for (index, (item, rest)) in request.items.iter().zip(parts).enumerate() {
        if item.modality != Modality::Image {
            return Err(PluginError::unsupported(format!("item {index}: only images are laid out")));
        }
        let n = feature_tokens(config, &item.grid)?;
        if n != item.grid.feature_tokens {
            return Err(PluginError::invalid(format!(
                "item {index}: the grid makes {n} feature tokens but the item says {}",
                item.grid.feature_tokens
            )));
        }
        let expansion = IMAGE_PAD.repeat(n as usize);
        text.push_str(&expansion);
        text.push_str(rest);
        items.push(ItemLayout {
            feature_token_id: config.image_token_id(),
            feature_tokens: n,
            expansion: expansion.into(),
        });
    }
    Ok(PromptLayout { text: text.into(), items: items.into() })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, RVec};

    use super::*;
    use crate::qwen_vl::QwenVl;
    use crate::qwen_vl::testing::{FIXTURES, VARIANTS, fixture_config, golden, grid, grids};

    fn request(config: &QwenVl, prompt: &str, grids: &[[u32; 3]]) -> LayoutRequest {
        let items: RVec<ItemMeta> =
            grids.iter().map(|&g| ItemMeta { modality: Modality::Image, grid: grid(config, g) }).collect();
        LayoutRequest { prompt: prompt.into(), items }
    }

    /// The expanded prompt's pad runs, as the golden `input_ids` have them.
    fn pad_runs(ids: &[i64], pad: i64) -> Vec<usize> {
        let mut runs = Vec::new();
        let mut run = 0;
        for &id in ids.iter().chain(std::iter::once(&-1)) {
            if id == pad {
                run += 1;
            } else if run > 0 {
                runs.push(run);
                run = 0;
            }
        }
        runs
    }

    #[test]
    fn each_placeholder_expands_to_its_grid_as_the_goldens_input_ids() {
        for name in FIXTURES {
            let config = fixture_config(name);
            for variant in VARIANTS {
                let golden = golden(name, variant);
                let prompt = golden.prompt().expect("prompt");
                let layout = layout(&config, &request(&config, prompt, &grids(name, variant))).expect("layout");
                let ids = golden.input_ids().expect("ids");
                let runs = pad_runs(&ids, i64::from(config.image_token_id));
                let counts: Vec<usize> = layout.items.iter().map(|i| i.feature_tokens as usize).collect();
                assert_eq!(counts, runs, "{name}/{variant}");
                // The expanded text holds exactly the golden's pads, in the golden's order.
                assert_eq!(layout.text.matches(IMAGE_PAD).count(), runs.iter().sum::<usize>(), "{variant}");
                assert_eq!(layout.text.replace(IMAGE_PAD, ""), prompt.replace(IMAGE_PAD, ""), "{variant}");
            }
        }
    }

    #[test]
    fn placeholder_and_image_counts_must_agree() {
        let config = fixture_config("qwen2_vl");
        let two = "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>";
        let err = layout(&config, &request(&config, two, &[[1, 4, 8]])).expect_err("one image for two placeholders");
        assert_eq!(err.message.as_str(), "the prompt has 2 <|image_pad|> placeholders for 1 images");
        let err = layout(&config, &request(&config, "no image", &[[1, 4, 8]])).expect_err("no placeholder");
        assert!(err.message.contains("0 <|image_pad|> placeholders"), "{err}");
    }

    #[test]
    fn a_grid_that_does_not_merge_is_refused() {
        let config = fixture_config("qwen2_vl");
        let bad = MediaGrid { dims: vec![1, 3, 8].into(), feature_tokens: 6 };
        assert!(feature_tokens(&config, &bad).is_err());
    }
}
