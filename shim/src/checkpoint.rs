//! Hugging Face checkpoint files as IREE sees them: the safetensors headers
//! (validated here, in Rust, so a truncated or malformed file is a clear
//! error rather than a fault deep in a parameter load) and the shard index.
//! Tensor bytes are never read by us: IREE maps them from the files.

use std::{
    collections::BTreeMap,
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

use crate::{
    error::{Error, Result},
    tensor::{DType, TensorDesc},
};

/// Headers larger than this are refused (the format's own reference limit).
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// One tensor in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// The safetensors dtype string (`F32`, `BF16`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    /// Byte range inside the file's data section.
    pub offsets: (u64, u64),
}

impl TensorEntry {
    /// The descriptor, when the dtype is one the runtime moves.
    pub fn desc(&self) -> Option<TensorDesc> {
        DType::from_safetensors(&self.dtype).map(|d| TensorDesc::new(d, self.shape.clone()))
    }
}

/// The tensors of a checkpoint, across one or more safetensors files.
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    files: Vec<PathBuf>,
    /// Per file, where its data section starts (8 + the header length).
    data_starts: Vec<u64>,
    /// Per file, the `format` its header's `__metadata__` names (`pt`, `mlx`, ...), if any.
    formats: Vec<Option<String>>,
    tensors: BTreeMap<String, TensorEntry>,
}

impl Checkpoint {
    /// Opens a checkpoint: a `.safetensors` file, or a directory holding
    /// `model.safetensors.index.json` (sharded) or `model.safetensors`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if !path.is_dir() {
            return Checkpoint::from_files([path]);
        }
        let index = path.join("model.safetensors.index.json");
        if index.exists() {
            return Checkpoint::from_shard_index(&index);
        }
        let single = path.join("model.safetensors");
        if single.exists() {
            return Checkpoint::from_files([single]);
        }
        Err(Error::CheckpointIo {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "neither model.safetensors.index.json nor model.safetensors is in this directory",
            ),
        })
    }

    /// Reads a `model.safetensors.index.json` and every shard it names, and
    /// checks that each tensor is where the index says.
    pub fn from_shard_index(index: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(index).map_err(|source| Error::CheckpointIo { path: index.into(), source })?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::CheckpointFormat { path: index.into(), reason: e.to_string() })?;
        let map = json["weight_map"]
            .as_object()
            .ok_or_else(|| Error::CheckpointFormat { path: index.into(), reason: "no \"weight_map\" object".into() })?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shards: Vec<String> = Vec::new();
        for file in map.values() {
            let file = file.as_str().ok_or_else(|| Error::CheckpointFormat {
                path: index.into(),
                reason: "a weight_map value is not a file name".into(),
            })?;
            // A shard is a file beside the index: a path elsewhere (`/`, `..`) would let an index
            // read any file the server can.
            let plain = Path::new(file).components().count() == 1
                && matches!(Path::new(file).components().next(), Some(std::path::Component::Normal(_)));
            if !plain {
                return Err(Error::CheckpointFormat {
                    path: index.into(),
                    reason: format!("shard {file:?} is not a file name in the checkpoint's directory"),
                });
            }
            if !shards.iter().any(|s| s == file) {
                shards.push(file.to_owned());
            }
        }
        shards.sort();
        let ckpt = Checkpoint::from_files(shards.iter().map(|s| dir.join(s)))?;
        for (key, file) in map {
            let file = file.as_str().unwrap_or_default();
            let found = ckpt.tensors.get(key).map(|t| &ckpt.files[t.file]);
            if found.map(|p| p.file_name() != Some(file.as_ref())).unwrap_or(true) {
                return Err(Error::CheckpointFormat {
                    path: index.into(),
                    reason: format!("the index puts {key:?} in {file}, which does not hold it"),
                });
            }
        }
        Ok(ckpt)
    }

    /// Reads the headers of the given safetensors files.
    pub fn from_files<P: AsRef<Path>>(files: impl IntoIterator<Item = P>) -> Result<Self> {
        let mut ckpt = Checkpoint::default();
        for path in files {
            let path = path.as_ref().to_owned();
            let file = ckpt.files.len();
            let (data_start, format, entries) = read_header(&path, file)?;
            for (key, entry) in entries {
                if ckpt.tensors.contains_key(&key) {
                    return Err(Error::CheckpointFormat {
                        path,
                        reason: format!("tensor {key:?} appears in more than one file"),
                    });
                }
                ckpt.tensors.insert(key, entry);
            }
            ckpt.files.push(path);
            ckpt.data_starts.push(data_start);
            ckpt.formats.push(format);
        }
        Ok(ckpt)
    }

    /// Whether every file says it was written by MLX (`"format": "mlx"` in its metadata, as
    /// MLX's `save_safetensors` writes): MLX's own conventions then apply, convolution kernels
    /// stored channels-last among them.
    pub fn mlx_format(&self) -> bool {
        !self.formats.is_empty() && self.formats.iter().all(|f| f.as_deref() == Some("mlx"))
    }

    /// The bytes of tensor `key` as stored.
    pub fn read(&self, key: &str) -> Result<Vec<u8>> {
        use std::io::{Seek, SeekFrom};
        let entry = self
            .tensors
            .get(key)
            .ok_or_else(|| Error::ParameterMissing { key: key.to_owned(), files: self.describe_files() })?;
        let path = &self.files[entry.file];
        let io = |source| Error::CheckpointIo { path: path.clone(), source };
        let mut f = File::open(path).map_err(io)?;
        f.seek(SeekFrom::Start(self.data_starts[entry.file] + entry.offsets.0)).map_err(io)?;
        let mut bytes = vec![0u8; (entry.offsets.1 - entry.offsets.0) as usize];
        f.read_exact(&mut bytes).map_err(io)?;
        Ok(bytes)
    }

    /// Whether every tensor of file `file` starts at a multiple of `align`
    /// bytes from the file's start (so at such an address when the file is
    /// mapped at a page boundary).
    pub fn file_aligned(&self, file: usize, align: u64) -> bool {
        let Some(&start) = self.data_starts.get(file) else { return false };
        self.tensors.values().filter(|t| t.file == file).all(|t| (start + t.offsets.0).is_multiple_of(align))
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn tensors(&self) -> &BTreeMap<String, TensorEntry> {
        &self.tensors
    }

    pub fn get(&self, key: &str) -> Option<&TensorEntry> {
        self.tensors.get(key)
    }

    /// The file names, for messages.
    pub fn describe_files(&self) -> String {
        self.files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// Parses and validates one file's header against the file's length; returns
/// where the data section starts, the metadata's `format` and the tensors.
type Header = (u64, Option<String>, Vec<(String, TensorEntry)>);

fn read_header(path: &Path, file: usize) -> Result<Header> {
    let io = |source| Error::CheckpointIo { path: path.to_owned(), source };
    let bad = |reason: String| Error::CheckpointFormat { path: path.to_owned(), reason };
    let mut f = File::open(path).map_err(io)?;
    let file_len = f.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| bad(format!("{file_len} bytes is too short for a header")))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
        return Err(bad(format!("header length {header_len} does not fit the {file_len}-byte file")));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(io)?;
    let json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not a json object: {e}")))?;
    let data_len = file_len - 8 - header_len;
    let mut out = Vec::with_capacity(json.len());
    let mut format = None;
    for (key, v) in json {
        if key == "__metadata__" {
            format = v.get("format").and_then(|f| f.as_str()).map(str::to_owned);
            continue;
        }
        let dtype = v["dtype"].as_str().ok_or_else(|| bad(format!("{key:?} has no dtype")))?.to_owned();
        let shape = v["shape"]
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad(format!("{key:?} has no valid shape")))?;
        let offsets = v["data_offsets"]
            .as_array()
            .and_then(|a| match a.as_slice() {
                [b, e] => Some((b.as_u64()?, e.as_u64()?)),
                _ => None,
            })
            .ok_or_else(|| bad(format!("{key:?} has no valid data_offsets")))?;
        if offsets.1 < offsets.0 {
            return Err(bad(format!("{key:?} ends before it begins")));
        }
        if offsets.1 > data_len {
            return Err(bad(format!(
                "{key:?} ends at byte {} of a {data_len}-byte data section (the file is truncated)",
                offsets.1
            )));
        }
        if let Some(d) = DType::from_safetensors(&dtype) {
            let want = shape.iter().try_fold(d.size() as u64, |n, &x| n.checked_mul(x as u64));
            if want != Some(offsets.1 - offsets.0) {
                return Err(bad(format!("{key:?}: {dtype} {shape:?} does not fill {} bytes", offsets.1 - offsets.0)));
            }
        }
        out.push((key, TensorEntry { dtype, shape, file, offsets }));
    }
    Ok((8 + header_len, format, out))
}
