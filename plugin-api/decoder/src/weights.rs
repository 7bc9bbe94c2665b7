//! The one place a decoder's logical weight names meet a checkpoint's keys.
//!
//! The graph names its tensors as a text model lays them out below its own
//! root (`embed_tokens.weight`, `layers.3.self_attn.q_proj.weight`,
//! `norm.weight`) plus the LM head; [`DecoderWeights::resolve`] finds where
//! the checkpoint keeps that root and the head, and [`DecoderWeights::check`]
//! holds each declared tensor against the checkpoint: present, of the shape
//! the config implies, in the dtype the graph reads, and dense. Every problem
//! is reported at once, before anything is compiled; a layout that matches in
//! two places is an error, not a first match.

use std::collections::BTreeMap;

use mlxcel_emit::Elem;

/// What the resolver knows of one checkpoint tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The safetensors dtype string (`F32`, `BF16`, `U32`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// A checkpoint's tensors by key: all the resolver reads.
pub type Index = BTreeMap<String, TensorInfo>;

/// Where text models keep their tensors: a text checkpoint under `model.`,
/// a vision-language one under its language model (transformers 5's
/// `model.language_model.`, the older `language_model.model.`), a bare
/// export at the top.
const ROOTS: [&str; 4] = ["model.", "model.language_model.", "language_model.model.", ""];
/// Where an untied LM head is kept.
const HEADS: [&str; 2] = ["lm_head.weight", "language_model.lm_head.weight"];

/// A quantized checkpoint's `quantization` (MLX's `config.json`): bits per weight and the
/// columns sharing one scale and bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantization {
    pub bits: u32,
    pub group_size: usize,
}

/// A linear layer's weight as a checkpoint stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Linear {
    /// One matrix in its dtype.
    Dense { weight: String },
    /// MLX's affine quantization: `weight` packs `bits`-bit integers into
    /// u32 words, and each group of `group_size` columns has a scale and a
    /// bias (`w = scale * q + bias`); `quantization` is `None` when the
    /// config does not say, which a graph reading it must refuse.
    Affine { weight: String, scales: String, biases: String, quantization: Option<Quantization> },
}

impl Linear {
    /// How the checkpoint stores the linear weight `key` (`...weight`): affine when
    /// `...scales` and `...biases` sit beside it, with the config's `quantization`.
    pub fn detect(index: &Index, key: &str, quantization: Option<Quantization>) -> Linear {
        let base = key.strip_suffix(".weight").unwrap_or(key);
        let (scales, biases) = (format!("{base}.scales"), format!("{base}.biases"));
        match (index.contains_key(&scales), index.contains_key(&biases)) {
            (true, true) => Linear::Affine { weight: key.to_owned(), scales, biases, quantization },
            _ => Linear::Dense { weight: key.to_owned() },
        }
    }
}

/// Why a checkpoint cannot serve a decoder's weights.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WeightsError {
    #[error("the checkpoint has no `embed_tokens.weight` under any text-model root ({roots})")]
    NoRoot { roots: String },
    #[error("the checkpoint holds a text model under more than one root ({0}); which one is the decoder is ambiguous")]
    AmbiguousRoot(String),
    #[error("the embeddings are not tied and the checkpoint has no LM head ({0})")]
    NoHead(String),
    #[error("the checkpoint has more than one LM head ({0}); which one is the decoder's is ambiguous")]
    AmbiguousHead(String),
    #[error("{} of the decoder's tensors do not match the checkpoint: {}", .0.len(), .0.join("; "))]
    Tensors(Vec<String>),
}

/// Where one checkpoint keeps a decoder's weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecoderWeights {
    /// The text model's root: the prefix of `embed_tokens.weight`.
    pub root: String,
    /// The untied LM head's key; `None` when the head is the embedding table.
    pub lm_head: Option<String>,
}

impl DecoderWeights {
    /// Finds the text model's root and its LM head in `index`; `tied` says whether the head
    /// is the embedding table.
    pub fn resolve(index: &Index, tied: bool) -> Result<Self, WeightsError> {
        let roots: Vec<&str> =
            ROOTS.into_iter().filter(|r| index.contains_key(&format!("{r}embed_tokens.weight"))).collect();
        let root = match roots.as_slice() {
            [] => return Err(WeightsError::NoRoot { roots: quoted(&ROOTS) }),
            [one] => *one,
            many => return Err(WeightsError::AmbiguousRoot(quoted(many))),
        };
        let lm_head = if tied {
            None
        } else {
            let heads: Vec<&str> = HEADS.into_iter().filter(|k| index.contains_key(*k)).collect();
            match heads.as_slice() {
                [] => return Err(WeightsError::NoHead(quoted(&HEADS))),
                [one] => Some((*one).to_owned()),
                many => return Err(WeightsError::AmbiguousHead(quoted(many))),
            }
        };
        Ok(DecoderWeights { root: root.to_owned(), lm_head })
    }

    /// The checkpoint key of the text-model tensor `logical` (`layers.0.mlp.up_proj.weight`).
    pub fn key(&self, logical: &str) -> String {
        format!("{}{logical}", self.root)
    }

    /// The key of the embedding table.
    pub fn embed(&self) -> String {
        self.key("embed_tokens.weight")
    }

    /// The problems of the declared tensors (key, shape) against `index` when the graph reads
    /// them as `dtype`: each missing one, each of another shape or dtype, each linear stored
    /// quantized (the graph reads dense weights).
    pub fn check<'a>(
        index: &Index,
        declared: impl IntoIterator<Item = (&'a str, &'a [usize])>,
        dtype: Elem,
    ) -> Result<(), WeightsError> {
        let mut problems = Vec::new();
        for (key, shape) in declared {
            if let Linear::Affine { .. } = Linear::detect(index, key, None) {
                problems.push(format!(
                    "`{key}` is affine-quantized (scales and biases beside it); this decoder reads dense weights"
                ));
                continue;
            }
            match index.get(key) {
                None => problems.push(format!("`{key}` is missing")),
                Some(t) if t.shape != shape => {
                    problems.push(format!("`{key}` has shape {:?}, the config needs {shape:?}", t.shape));
                }
                Some(t) if Elem::from_safetensors(&t.dtype) != Some(dtype) => {
                    problems.push(format!("`{key}` is {}, the decoder reads {dtype}", t.dtype));
                }
                Some(_) => {}
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(WeightsError::Tensors(problems)) }
    }
}

fn quoted(items: &[&str]) -> String {
    items.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(keys: &[(&str, &str, &[usize])]) -> Index {
        keys.iter()
            .map(|(k, dtype, shape)| {
                ((*k).to_owned(), TensorInfo { dtype: (*dtype).to_owned(), shape: shape.to_vec() })
            })
            .collect()
    }

    #[test]
    fn the_root_and_head_are_found_once_or_refused() {
        let text = index(&[("model.embed_tokens.weight", "F32", &[8, 4]), ("lm_head.weight", "F32", &[8, 4])]);
        let w = DecoderWeights::resolve(&text, false).expect("text layout");
        assert_eq!((w.root.as_str(), w.lm_head.as_deref()), ("model.", Some("lm_head.weight")));
        assert_eq!(w.key("layers.0.mlp.up_proj.weight"), "model.layers.0.mlp.up_proj.weight");
        assert_eq!(DecoderWeights::resolve(&text, true).expect("tied").lm_head, None);

        let vlm = index(&[("model.language_model.embed_tokens.weight", "F32", &[8, 4])]);
        assert_eq!(DecoderWeights::resolve(&vlm, true).expect("vlm layout").root, "model.language_model.");

        let both = index(&[
            ("model.embed_tokens.weight", "F32", &[8, 4]),
            ("language_model.model.embed_tokens.weight", "F32", &[8, 4]),
        ]);
        assert_eq!(
            DecoderWeights::resolve(&both, true),
            Err(WeightsError::AmbiguousRoot("`model.`, `language_model.model.`".into()))
        );
        assert!(matches!(DecoderWeights::resolve(&index(&[]), true), Err(WeightsError::NoRoot { .. })));
        assert!(matches!(DecoderWeights::resolve(&vlm, false), Err(WeightsError::NoHead(_))));
        let heads = index(&[
            ("model.embed_tokens.weight", "F32", &[8, 4]),
            ("lm_head.weight", "F32", &[8, 4]),
            ("language_model.lm_head.weight", "F32", &[8, 4]),
        ]);
        assert!(matches!(DecoderWeights::resolve(&heads, false), Err(WeightsError::AmbiguousHead(_))));
    }

    #[test]
    fn every_declared_tensor_is_checked_and_every_problem_reported() {
        let idx = index(&[
            ("a.weight", "F32", &[2, 3]),
            ("b.weight", "F32", &[3, 3]),
            ("c.weight", "BF16", &[2]),
            ("q.weight", "U32", &[4, 1]),
            ("q.scales", "F32", &[4, 1]),
            ("q.biases", "F32", &[4, 1]),
        ]);
        assert_eq!(DecoderWeights::check(&idx, [("a.weight", &[2usize, 3][..])], Elem::F32), Ok(()));
        let declared: [(&str, &[usize]); 5] = [
            ("a.weight", &[2, 3]),
            ("b.weight", &[2, 3]),
            ("c.weight", &[2]),
            ("d.weight", &[1]),
            ("q.weight", &[4, 8]),
        ];
        let Err(WeightsError::Tensors(problems)) = DecoderWeights::check(&idx, declared, Elem::F32) else {
            panic!("problems expected");
        };
        assert_eq!(
            problems,
            [
                "`b.weight` has shape [3, 3], the config needs [2, 3]",
                "`c.weight` is BF16, the decoder reads f32",
                "`d.weight` is missing",
                "`q.weight` is affine-quantized (scales and biases beside it); this decoder reads dense weights",
            ]
        );
    }

    #[test]
    fn a_linear_with_scales_and_biases_beside_it_is_affine() {
        let idx = index(&[("q.weight", "U32", &[4, 1]), ("q.scales", "F32", &[4, 1]), ("q.biases", "F32", &[4, 1])]);
        assert_eq!(
            Linear::detect(&idx, "q.weight", Some(Quantization { bits: 4, group_size: 64 })),
            Linear::Affine {
                weight: "q.weight".into(),
                scales: "q.scales".into(),
                biases: "q.biases".into(),
                quantization: Some(Quantization { bits: 4, group_size: 64 }),
            }
        );
        assert_eq!(Linear::detect(&idx, "p.weight", None), Linear::Dense { weight: "p.weight".into() });
    }
}
