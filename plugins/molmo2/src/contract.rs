//! The prepared-prefill contract, as `Molmo2Model.forward` merges and masks:
//!
//! - placements: the image features are **added** to the embeddings of the `<im_patch>`
//!   tokens (`inputs_embeds[mask] + image_features`), which `<im_col>` separates, so each item
//!   takes the next `feature_tokens` of them in prompt order (`masked_scatter` fills them so);
//! - mask: causal, plus bidirectional attention among every image token (`mm_token_type_ids`
//!   is 1 on all of the processor's image tokens and the block id is 0 for all of them): one
//!   allowing block for every ordered pair of runs of image tokens. Images side by side are one
//!   run; images with text between them are several runs that still all see each other (the
//!   text between stays causal), as the reference's one block id makes them;
//! - positions: plain 1-D `0..n`; no text scaling.

use mlxcel_plugin_api::{
    AttentionMask, ContractRequest, MaskBlock, PlaceMode, PluginError, Positions, PrefillProgram, ProgramPlacement,
    RVec, TokenSet,
};

use crate::config::Molmo2Config;
use crate::vision::FEATURES;

pub(crate) fn contract(config: &Molmo2Config, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
    let ids = request.token_ids.as_slice();
    let n = u32::try_from(ids.len()).map_err(|_| PluginError::too_large("the prompt is too long"))?;
    let patches: Vec<u32> = (0..n).filter(|&i| ids[i as usize] == config.tokens.image_patch).collect();
    let wanted: usize = request.items.iter().map(|i| i.grid.feature_tokens as usize).sum();
    if patches.len() != wanted {
        return Err(PluginError::invalid(format!(
            "the prompt has {} <im_patch> tokens; its {} images have {wanted} feature rows",
            patches.len(),
            request.items.len()
        )));
    }
    let mut placements = Vec::with_capacity(request.items.len());
    let mut next = patches.into_iter();
    for (index, item) in request.items.iter().enumerate() {
        let indices: RVec<u32> = next.by_ref().take(item.grid.feature_tokens as usize).collect();
        placements.push(ProgramPlacement {
            item: index as u32,
            encoder_output: FEATURES.into(),
            mode: PlaceMode::Add,
            tokens: TokenSet::List { indices },
        });
    }

    // Maximal runs of image tokens.
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for (at, &id) in ids.iter().enumerate() {
        if !config.tokens.is_image(id) {
            continue;
        }
        match runs.last_mut() {
            Some((start, len)) if *start + *len == at as u32 => *len += 1,
            _ => runs.push((at as u32, 1)),
        }
    }
    let mut mask = AttentionMask::causal();
    for &(rows_at, rows) in &runs {
        for &(cols_at, cols) in &runs {
            mask.blocks.push(MaskBlock { row_start: rows_at, rows, col_start: cols_at, cols, allow: true });
        }
    }
    Ok(PrefillProgram {
        text_scale: 1.0,
        placements: placements.into(),
        positions: Positions::sequential(n),
        mask,
        injections: RVec::new(),
    })
}
