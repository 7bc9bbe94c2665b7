//! Fixture directories and the goldens of one prompt variant.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde_json::Value;

use crate::compare::{Report, Tolerance, compare_f32, compare_i64};
use crate::error::Error;
use crate::tensor::Tensor;

/// The golden file format this crate reads (`golden_format` in each file's metadata).
const GOLDEN_FORMAT: &str = "1";

/// `tests/fixtures` of this workspace, or `$MLXCEL_FIXTURES` when set.
pub fn fixtures_root() -> PathBuf {
    match std::env::var_os("MLXCEL_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    fs::read(path).map_err(|source| Error::Io { path: path.to_owned(), source })
}

fn read_json(path: &Path) -> Result<Value, Error> {
    serde_json::from_slice(&read(path)?).map_err(|source| Error::Json { path: path.to_owned(), source })
}

/// One oracle fixture: a tiny checkpoint plus goldens for each prompt variant.
#[derive(Debug, Clone)]
pub struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    pub fn open(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `tests/fixtures/<name>` (see [`fixtures_root`]).
    pub fn named(name: &str) -> Result<Self, Error> {
        let dir = fixtures_root().join(name);
        let probe = dir.join("provenance.json");
        fs::metadata(&probe).map_err(|source| Error::Io { path: probe, source })?;
        Ok(Self::open(dir))
    }

    /// The checkpoint directory (config.json, model.safetensors, tokenizer.json, ...).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint's tensors (`model.safetensors`) by name, from its header: the dtype as
    /// safetensors spells it (`F32`, `BF16`, `U32`) and the shape.
    pub fn checkpoint_tensors(&self) -> Result<BTreeMap<String, (String, Vec<usize>)>, Error> {
        let path = self.dir.join("model.safetensors");
        let bytes = read(&path)?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|source| Error::SafeTensors { path, source })?;
        Ok(meta
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, (format!("{:?}", info.dtype), info.shape.clone())))
            .collect())
    }

    /// Variant names, sorted (`short`, `long`, `image`, `two_images`, `text_only`, ...).
    pub fn variants(&self) -> Result<Vec<String>, Error> {
        let goldens = self.dir.join("goldens");
        let entries = fs::read_dir(&goldens).map_err(|source| Error::Io { path: goldens.clone(), source })?;
        let mut names = Vec::new();
        for entry in entries {
            let path = entry.map_err(|source| Error::Io { path: goldens.clone(), source })?.path();
            if path.extension().is_some_and(|e| e == "safetensors")
                && let Some(stem) = path.file_stem()
            {
                names.push(stem.to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// `provenance.json`: reference, versions, seed, command, prefill chunk, variant descriptions.
    pub fn provenance(&self) -> Result<Value, Error> {
        read_json(&self.dir.join("provenance.json"))
    }

    /// Loads one variant's tensors and metadata.
    pub fn golden(&self, variant: &str) -> Result<Golden, Error> {
        let path = self.dir.join("goldens").join(format!("{variant}.safetensors"));
        let bytes = read(&path)?;
        let st_err = |source| Error::SafeTensors { path: path.clone(), source };
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(st_err)?;
        let format = header.metadata().as_ref().and_then(|m| m.get("golden_format")).cloned();
        if format.as_deref() != Some(GOLDEN_FORMAT) {
            return Err(Error::Format { path, found: format, expected: GOLDEN_FORMAT });
        }
        let st = SafeTensors::deserialize(&bytes).map_err(st_err)?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.iter() {
            let tensor = Tensor::from_view(view.dtype(), view.shape(), view.data()).ok_or_else(|| Error::Dtype {
                stage: name.to_owned(),
                expected: "f32, i64 or u8",
                found: format!("{:?}", view.dtype()),
            })?;
            tensors.insert(name.to_owned(), tensor);
        }
        let meta = read_json(&self.dir.join("goldens").join(format!("{variant}.json")))?;
        Ok(Golden { variant: variant.to_owned(), meta, tensors })
    }
}

/// The goldens of one prompt variant: a tensor per stage plus JSON metadata.
#[derive(Debug, Clone)]
pub struct Golden {
    variant: String,
    meta: Value,
    tensors: BTreeMap<String, Tensor>,
}

impl Golden {
    pub fn variant(&self) -> &str {
        &self.variant
    }

    /// Stage names present in this golden, sorted.
    pub fn stages(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn has(&self, stage: &str) -> bool {
        self.tensors.contains_key(stage)
    }

    pub fn tensor(&self, stage: &str) -> Result<&Tensor, Error> {
        self.tensors.get(stage).ok_or_else(|| Error::MissingStage {
            variant: self.variant.clone(),
            stage: stage.to_owned(),
            available: self.tensors.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// The whole metadata object (prompt, messages, images, greedy tokens, ...).
    pub fn meta(&self) -> &Value {
        &self.meta
    }

    pub fn field(&self, name: &str) -> Result<&Value, Error> {
        self.meta.get(name).ok_or_else(|| Error::MissingField { variant: self.variant.clone(), field: name.to_owned() })
    }

    fn int_stage(&self, stage: &str) -> Result<Vec<i64>, Error> {
        let t = self.tensor(stage)?;
        t.to_i64().ok_or_else(|| Error::Dtype {
            stage: stage.to_owned(),
            expected: "i64 or u8",
            found: t.dtype_name().to_owned(),
        })
    }

    /// The prompt's token ids.
    pub fn input_ids(&self) -> Result<Vec<i64>, Error> {
        self.int_stage("input_ids")
    }

    /// The greedy tokens the reference decoded with its KV cache.
    pub fn greedy_tokens(&self) -> Result<Vec<i64>, Error> {
        self.int_stage("greedy_tokens")
    }

    /// The rendered chat prompt the token ids came from.
    pub fn prompt(&self) -> Result<&str, Error> {
        self.field("prompt")?
            .as_str()
            .ok_or_else(|| Error::MissingField { variant: self.variant.clone(), field: "prompt (string)".to_owned() })
    }

    /// Smallest top-1 minus top-2 logit gap along the greedy path: logit errors must stay well below it
    /// for greedy tokens to be comparable.
    pub fn min_greedy_margin(&self) -> Result<f64, Error> {
        self.field("min_greedy_margin")?.as_f64().ok_or_else(|| Error::MissingField {
            variant: self.variant.clone(),
            field: "min_greedy_margin (number)".to_owned(),
        })
    }

    /// Compares float values for `stage` (row-major, golden's shape) within `tolerance`.
    pub fn check_f32(&self, stage: &str, got: &[f32], tolerance: Tolerance) -> Result<Report, Error> {
        compare_f32(stage, got, self.tensor(stage)?, tolerance)
    }

    /// Compares integer values for `stage` (ids, positions, masks, grids) exactly.
    pub fn check_i64(&self, stage: &str, got: &[i64]) -> Result<Report, Error> {
        compare_i64(stage, got, self.tensor(stage)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use safetensors::Dtype;
    use safetensors::tensor::TensorView;

    use super::*;

    fn write_fixture(dir: &Path, format: &str) {
        let goldens = dir.join("goldens");
        fs::create_dir_all(&goldens).expect("create goldens dir");
        let logits: Vec<u8> = [0.5f32, -1.0, 2.0, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let ids: Vec<u8> = [3i64, 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        let views = vec![
            ("logits", TensorView::new(Dtype::F32, vec![2, 2], &logits).expect("view")),
            ("input_ids", TensorView::new(Dtype::I64, vec![2], &ids).expect("view")),
        ];
        let meta = HashMap::from([("golden_format".to_owned(), format.to_owned())]);
        let bytes = safetensors::serialize(views, Some(meta)).expect("serialize");
        fs::write(goldens.join("short.safetensors"), bytes).expect("write goldens");
        fs::write(goldens.join("short.json"), r#"{"prompt": "hi", "min_greedy_margin": 0.25}"#).expect("write json");
        fs::write(dir.join("provenance.json"), r#"{"seed": 1234}"#).expect("write provenance");
    }

    #[test]
    fn loads_variants_tensors_and_metadata() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_fixture(tmp.path(), GOLDEN_FORMAT);
        let fixture = Fixture::open(tmp.path());
        assert_eq!(fixture.variants().expect("variants"), vec!["short"]);
        assert_eq!(fixture.provenance().expect("provenance")["seed"], 1234);
        let g = fixture.golden("short").expect("golden");
        assert_eq!(g.stages().collect::<Vec<_>>(), vec!["input_ids", "logits"]);
        assert_eq!(g.input_ids().expect("ids"), vec![3, 4]);
        assert_eq!(g.prompt().expect("prompt"), "hi");
        assert_eq!(g.min_greedy_margin().expect("margin"), 0.25);
        g.check_f32("logits", &[0.5, -1.0, 2.0, 0.0], Tolerance::EXACT).expect("identical logits");
        let err = g.check_f32("logits", &[0.5, -1.0, 2.0, 0.1], Tolerance::abs(1e-4)).expect_err("diverges");
        assert!(err.to_string().contains("flat index 3 [1, 1]"), "{err}");
        assert!(matches!(g.tensor("pixel_values"), Err(Error::MissingStage { .. })));
        assert!(matches!(g.field("rope_delta"), Err(Error::MissingField { .. })));
    }

    #[test]
    fn rejects_an_unknown_golden_format() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_fixture(tmp.path(), "0");
        let err = Fixture::open(tmp.path()).golden("short").expect_err("format 0");
        assert!(matches!(err, Error::Format { .. }), "{err}");
    }

    #[test]
    fn missing_files_name_their_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = Fixture::open(tmp.path()).golden("nope").expect_err("no such variant");
        assert!(err.to_string().contains("nope.safetensors"), "{err}");
    }
}
