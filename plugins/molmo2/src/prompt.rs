//! Placeholder expansion, as `Molmo2Processor.replace_image_token` does it: the chat template
//! renders `<|image|>` once per image, and the i-th one becomes the image's two blocks, the
//! low-resolution view then the high-resolution one:
//!
//! `<low_res_im_start>` + (`<im_patch>` x w + `<im_col>`) x h + `<im_end>` +
//! `<im_start>` + (`<im_patch>` x W + `<im_col>`) x H + `<im_end>`
//!
//! with `(h, w)` the pooled global crop and `(H, W)` the pooled high-resolution canvas (the
//! item's grid), `<im_col>` after each row only when the processor config says so, and
//! `<im_start>` opening the low-resolution block when `use_single_crop_start_token` is off.
//! Every `<im_patch>` receives one feature row, added to its embedding.

use mlxcel_plugin_api::{ItemLayout, LayoutRequest, Modality, PluginError, PromptLayout};

use crate::config::Molmo2Config;

/// The placeholder the chat template renders (the tokenizer's `image_token`).
pub(crate) const PLACEHOLDER: &str = "<|image|>";
const PATCH: &str = "<im_patch>";
const COL: &str = "<im_col>";
const START: &str = "<im_start>";
const LOW_RES_START: &str = "<low_res_im_start>";
const END: &str = "<im_end>";

/// One view's block: `start`, then `rows` rows of `cols` patches (each closed by `<im_col>`
/// when `col`), then `<im_end>`.
fn block(start: &str, rows: usize, cols: usize, col: bool) -> String {
    let row = format!("{}{}", PATCH.repeat(cols), if col { COL } else { "" });
    format!("{start}{}{END}", row.repeat(rows))
}

/// An image's whole expansion for its grid `[h, w, H, W]`.
pub(crate) fn image_string(config: &Molmo2Config, grid: [usize; 4]) -> String {
    let [h, w, rows, cols] = grid;
    let l = &config.layout;
    let low_start = if l.single_crop_start_token { LOW_RES_START } else { START };
    format!("{}{}", block(low_start, h, w, l.single_crop_col_tokens), block(START, rows, cols, l.col_tokens))
}

/// Replaces the `i`-th `<|image|>` with item `i`'s blocks.
pub(crate) fn layout(config: &Molmo2Config, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
    let prompt = request.prompt.as_str();
    let placeholders = prompt.matches(PLACEHOLDER).count();
    if placeholders != request.items.len() {
        return Err(PluginError::invalid(format!(
            "the prompt has {placeholders} {PLACEHOLDER} placeholders for {} images",
            request.items.len()
        )));
    }
    let mut parts = prompt.split(PLACEHOLDER);
    let mut text = parts.next().unwrap_or_default().to_owned();
    let mut items = Vec::with_capacity(request.items.len());
    for (index, (item, rest)) in request.items.iter().zip(parts).enumerate() {
        if item.modality != Modality::Image {
            return Err(PluginError::unsupported(format!("item {index}: molmo2 lays out images only")));
        }
        let grid: [usize; 4] = match item.grid.dims.as_slice() {
            &[h, w, rows, cols] => [h, w, rows, cols].map(|d| d as usize),
            other => return Err(PluginError::invalid(format!("item {index}: grid {other:?} is not [h, w, H, W]"))),
        };
        let patches = grid[0] * grid[1] + grid[2] * grid[3];
        if patches != item.grid.feature_tokens as usize {
            return Err(PluginError::invalid(format!(
                "item {index}: a grid of {patches} patches with {} feature rows",
                item.grid.feature_tokens
            )));
        }
        let expansion = image_string(config, grid);
        text.push_str(&expansion);
        text.push_str(rest);
        items.push(ItemLayout {
            feature_token_id: config.tokens.image_patch,
            feature_tokens: item.grid.feature_tokens,
            expansion: expansion.into(),
        });
    }
    Ok(PromptLayout { text: text.into(), items: items.into() })
}
