//! The prepared-prefill contract of families whose encoder rows replace their image tokens in
//! order, as transformers' `masked_scatter` and mlx-vlm's `merge_input_ids_with_image_features`
//! merge them: the prompt's image tokens take the items' rows one after another, so item `i`
//! takes the `i`-th `feature_tokens` of them (adjacent placeholders make one longer run, split
//! in item order). Text embeddings unscaled, 1-D positions `0..n`, a causal mask.
//!
//! Each item's tokens must be consecutive: the placeholder expansion writes them so, and a
//! prompt that scatters them is refused rather than guessed at.

use mlxcel_plugin_api::{
    AttentionMask, ContractRequest, PluginError, Positions, PrefillProgram, ProgramPlacement, RVec,
};

/// The contract for `request`: each item's encoder output `output` replaces its run of `token`.
pub fn replace_in_order(request: &ContractRequest, token: u32, output: &str) -> Result<PrefillProgram, PluginError> {
    let ids = request.token_ids.as_slice();
    let len = u32::try_from(ids.len()).map_err(|_| PluginError::too_large("the prompt is too long"))?;
    let at: Vec<usize> = ids.iter().enumerate().filter(|&(_, &t)| t == token).map(|(i, _)| i).collect();
    let want: u64 = request.items.iter().map(|item| u64::from(item.grid.feature_tokens)).sum();
    if at.len() as u64 != want {
        return Err(PluginError::invalid(format!(
            "the prompt has {} image tokens; its {} images have {want} feature rows",
            at.len(),
            request.items.len()
        )));
    }
    let mut placements = Vec::with_capacity(request.items.len());
    let mut taken = 0usize;
    for (index, item) in request.items.iter().enumerate() {
        let rows = item.grid.feature_tokens as usize;
        let own = &at[taken..taken + rows];
        let (Some(&start), Some(&last)) = (own.first(), own.last()) else {
            return Err(PluginError::invalid(format!("image {index} has no feature rows")));
        };
        if last != start + rows - 1 {
            return Err(PluginError::invalid(format!(
                "image {index}'s {rows} image tokens are not consecutive (from token {start})"
            )));
        }
        placements.push(ProgramPlacement::replace_span(index as u32, output, start as u32, rows as u32));
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

    const PAD: u32 = 9;

    fn request(ids: &[u32], rows: &[u32]) -> ContractRequest {
        let item = |&n: &u32| ItemMeta {
            modality: Modality::Image,
            grid: MediaGrid { dims: vec![1, 2, 2 * n].into(), feature_tokens: n },
        };
        ContractRequest { token_ids: ids.to_vec().into(), items: rows.iter().map(item).collect() }
    }

    fn spans(program: &PrefillProgram) -> Vec<(u32, u32)> {
        program.placements.iter().map(|p| p.span().expect("a span")).collect()
    }

    #[test]
    fn items_take_the_image_tokens_in_order_at_sequential_positions() {
        // Two adjacent images of 2 and 3 rows, then a third after text.
        let ids = [1, PAD, PAD, PAD, PAD, PAD, 2, 3, PAD, 4];
        let program = replace_in_order(&request(&ids, &[2, 3, 1]), PAD, "features").expect("contract");
        assert_eq!(spans(&program), [(1, 2), (3, 3), (8, 1)]);
        assert_eq!(program.positions, Positions::sequential(10));
        assert_eq!((program.text_scale, &program.mask), (1.0, &AttentionMask::causal()));
        let text = replace_in_order(&request(&[1, 2, 3], &[]), PAD, "features").expect("text only");
        assert!(text.placements.is_empty());
    }

    #[test]
    fn tokens_that_disagree_with_the_items_are_refused() {
        let refused = |ids: &[u32], rows: &[u32]| {
            replace_in_order(&request(ids, rows), PAD, "features").expect_err("refused").message.to_string()
        };
        assert_eq!(refused(&[1, PAD, PAD], &[1]), "the prompt has 2 image tokens; its 1 images have 1 feature rows");
        assert_eq!(refused(&[PAD, 1], &[]), "the prompt has 1 image tokens; its 0 images have 0 feature rows");
        assert_eq!(refused(&[PAD, 1, PAD], &[2]), "image 0's 2 image tokens are not consecutive (from token 0)");
        assert_eq!(refused(&[PAD, 1], &[0, 1]), "image 0 has no feature rows");
    }
}
