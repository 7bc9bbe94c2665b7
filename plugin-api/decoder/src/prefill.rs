//! The prepared prefill as a typed program: what a family's contract asks of the text
//! embeddings, applied by one function.
//!
//! A [`Program`] holds placements (feature rows written over, or added to, the embeddings at a
//! list of token indices) and per-layer injections (rows added to a decoder layer's output at a
//! list of token indices, as Qwen3-VL's DeepStack does). [`Program::apply`] checks every index,
//! row count and layer before it writes anything, refuses two placements that claim one token,
//! and returns the merged embeddings with one dense `[n, hidden]` tensor per injected layer.
//! The embeddings are f32 here; a checkpoint whose decoder embeds in another dtype converts at
//! the host's boundary.

/// How a placement's rows combine with the text embeddings at its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The rows replace the embeddings (the image tokens become the features).
    Replace,
    /// The rows are added to the embeddings (Molmo adds its features to the placeholder tokens).
    Add,
}

/// One item's rows, placed at `tokens` (one row per index, in order).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub mode: Mode,
    pub tokens: Vec<usize>,
    /// Whole rows of `hidden` values, row-major, at least one per token: the first
    /// `tokens.len()` are placed, as the plugin ABI says a placement takes its encoder output's
    /// first rows (Gemma 3n places one row of an output that holds several).
    pub rows: Vec<f32>,
}

/// Rows added to the output of decoder layer `layer` at `tokens`.
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    pub layer: usize,
    pub tokens: Vec<usize>,
    /// `tokens.len() * hidden` values, row-major.
    pub rows: Vec<f32>,
}

/// What a prefill does to the text embeddings of an `n`-token prompt.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    pub placements: Vec<Placement>,
    pub injections: Vec<Injection>,
}

/// The merged prefill input: the embeddings `[n, hidden]` and, for each injected layer `0..k`,
/// its `[n, hidden]` rows (zero where nothing is injected).
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    pub embeddings: Vec<f32>,
    pub injections: Vec<Vec<f32>>,
}

/// Why a program cannot be applied.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    #[error("the text embeddings hold {values} values, not {n} rows of {hidden}")]
    Text { values: usize, n: usize, hidden: usize },
    #[error("{what} {index} places a row at token {token} of a {n}-token prompt")]
    OutOfRange { what: &'static str, index: usize, token: usize, n: usize },
    #[error("{what} {index} has {values} values, not whole rows of {hidden} for its {tokens} tokens")]
    Rows { what: &'static str, index: usize, values: usize, tokens: usize, hidden: usize },
    #[error("placements {first} and {second} both place a row at token {token}")]
    Overlap { first: usize, second: usize, token: usize },
    #[error("injection {index} feeds layer {layer}; this decoder takes injections after layers 0..{layers}")]
    Layer { index: usize, layer: usize, layers: usize },
}

impl Program {
    /// Applies the program to `text` (`n` rows of `hidden`, already scaled as the family's text
    /// embeddings are). `injected_layers` is how many leading decoder layers take injections
    /// (the decoder's DeepStack layers); a program with injections fills all of them.
    pub fn apply(&self, text: &[f32], n: usize, hidden: usize, injected_layers: usize) -> Result<Merged, ProgramError> {
        if text.len() != n * hidden {
            return Err(ProgramError::Text { values: text.len(), n, hidden });
        }
        let mut owner: Vec<Option<usize>> = vec![None; n];
        for (index, p) in self.placements.iter().enumerate() {
            check_rows("placement", index, &p.tokens, &p.rows, n, hidden)?;
            for &token in &p.tokens {
                if let Some(first) = owner[token].replace(index) {
                    return Err(ProgramError::Overlap { first, second: index, token });
                }
            }
        }
        for (index, inj) in self.injections.iter().enumerate() {
            if inj.layer >= injected_layers {
                return Err(ProgramError::Layer { index, layer: inj.layer, layers: injected_layers });
            }
            check_rows("injection", index, &inj.tokens, &inj.rows, n, hidden)?;
        }

        let mut embeddings = text.to_vec();
        for p in &self.placements {
            for (row, &token) in p.rows.chunks_exact(hidden).zip(&p.tokens) {
                let at = &mut embeddings[token * hidden..(token + 1) * hidden];
                match p.mode {
                    Mode::Replace => at.copy_from_slice(row),
                    Mode::Add => at.iter_mut().zip(row).for_each(|(x, r)| *x += r),
                }
            }
        }
        let injections = if self.injections.is_empty() {
            Vec::new()
        } else {
            let mut layers = vec![vec![0.0f32; n * hidden]; injected_layers];
            for inj in &self.injections {
                let layer = &mut layers[inj.layer];
                for (row, &token) in inj.rows.chunks_exact(hidden).zip(&inj.tokens) {
                    let at = &mut layer[token * hidden..(token + 1) * hidden];
                    at.iter_mut().zip(row).for_each(|(x, r)| *x += r);
                }
            }
            layers
        };
        Ok(Merged { embeddings, injections })
    }
}

fn check_rows(
    what: &'static str,
    index: usize,
    tokens: &[usize],
    rows: &[f32],
    n: usize,
    hidden: usize,
) -> Result<(), ProgramError> {
    if let Some(&token) = tokens.iter().find(|&&t| t >= n) {
        return Err(ProgramError::OutOfRange { what, index, token, n });
    }
    if rows.len() < tokens.len() * hidden || (hidden > 0 && !rows.len().is_multiple_of(hidden)) {
        return Err(ProgramError::Rows { what, index, values: rows.len(), tokens: tokens.len(), hidden });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four tokens of width 2: token t's embedding is [t, t].
    fn text() -> Vec<f32> {
        (0..4).flat_map(|t| [t as f32, t as f32]).collect()
    }

    #[test]
    fn placements_replace_or_add_at_their_tokens_and_leave_the_rest() {
        let program = Program {
            placements: vec![
                Placement { mode: Mode::Replace, tokens: vec![1, 2], rows: vec![10.0, 11.0, 20.0, 21.0] },
                Placement { mode: Mode::Add, tokens: vec![3], rows: vec![0.5, -0.5] },
            ],
            injections: Vec::new(),
        };
        let merged = program.apply(&text(), 4, 2, 0).expect("applies");
        assert_eq!(merged.embeddings, [0.0, 0.0, 10.0, 11.0, 20.0, 21.0, 3.5, 2.5]);
        assert!(merged.injections.is_empty());
    }

    #[test]
    fn injections_fill_every_injected_layer_with_zeros_elsewhere() {
        let program = Program {
            placements: Vec::new(),
            injections: vec![
                Injection { layer: 1, tokens: vec![2], rows: vec![1.0, 2.0] },
                Injection { layer: 1, tokens: vec![2, 3], rows: vec![1.0, 1.0, 5.0, 5.0] },
            ],
        };
        let merged = program.apply(&text(), 4, 2, 3).expect("applies");
        assert_eq!(merged.embeddings, text());
        assert_eq!(merged.injections.len(), 3);
        assert_eq!(merged.injections[0], [0.0; 8]);
        assert_eq!(merged.injections[1], [0.0, 0.0, 0.0, 0.0, 2.0, 3.0, 5.0, 5.0]);
        assert_eq!(merged.injections[2], [0.0; 8]);
    }

    #[test]
    fn bad_programs_are_refused_before_anything_is_written() {
        let one = |mode, tokens: Vec<usize>, rows: Vec<f32>| Placement { mode, tokens, rows };
        let refuse = |program: Program, layers: usize| program.apply(&text(), 4, 2, layers).expect_err("refused");
        assert_eq!(
            refuse(Program { placements: vec![one(Mode::Replace, vec![4], vec![0.0; 2])], ..Program::default() }, 0),
            ProgramError::OutOfRange { what: "placement", index: 0, token: 4, n: 4 }
        );
        assert_eq!(
            refuse(Program { placements: vec![one(Mode::Replace, vec![0, 1], vec![0.0; 2])], ..Program::default() }, 0),
            ProgramError::Rows { what: "placement", index: 0, values: 2, tokens: 2, hidden: 2 }
        );
        assert_eq!(
            refuse(Program { placements: vec![one(Mode::Replace, vec![0], vec![0.0; 3])], ..Program::default() }, 0),
            ProgramError::Rows { what: "placement", index: 0, values: 3, tokens: 1, hidden: 2 }
        );
        // More whole rows than tokens: the first are placed.
        let first =
            Program { placements: vec![one(Mode::Replace, vec![3], vec![9.0, 9.0, 7.0, 7.0])], ..Program::default() };
        assert_eq!(first.apply(&text(), 4, 2, 0).expect("first rows").embeddings[6..], [9.0, 9.0]);
        let overlap = Program {
            placements: vec![one(Mode::Replace, vec![1, 2], vec![0.0; 4]), one(Mode::Add, vec![2], vec![0.0; 2])],
            ..Program::default()
        };
        assert_eq!(refuse(overlap, 0), ProgramError::Overlap { first: 0, second: 1, token: 2 });
        let deep = Program {
            injections: vec![Injection { layer: 2, tokens: vec![0], rows: vec![0.0; 2] }],
            ..Program::default()
        };
        assert_eq!(refuse(deep, 2), ProgramError::Layer { index: 0, layer: 2, layers: 2 });
        assert_eq!(
            Program::default().apply(&[0.0; 7], 4, 2, 0),
            Err(ProgramError::Text { values: 7, n: 4, hidden: 2 })
        );
    }
}
