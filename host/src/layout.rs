//! Checkpoint tensors a graph reads in another layout than they are stored in: an MLX
//! checkpoint's convolution kernels, stored channels-last (`[out, k..., in]`) where the graphs
//! declare transformers' `[out, in, k...]`. The rule is the resolver's
//! ([`mlxcel_decoder::stored_layout`]); this serves such a tensor transposed, from a small
//! safetensors file derived once from the checkpoint's bytes and kept beside the compile cache,
//! under a key of its own that the parameter aliases point at.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlxcel_decoder::{StoredLayout, stored_layout};
use mlxcel_plugin_api::TensorSpec;
use mlxcel_shim::Checkpoint;
use sha2::Digest;

/// The checkpoint the graph's parameters are served from, and the aliases (logical name →
/// key) to serve them under: `checkpoint` itself when every parameter is stored as declared,
/// else `checkpoint` with one derived file per transposed tensor, the aliases pointing there.
pub(crate) fn serve_declared(
    checkpoint: Checkpoint,
    mut aliases: BTreeMap<String, String>,
    parameters: &[TensorSpec],
    derived: &Path,
) -> Result<(Checkpoint, BTreeMap<String, String>)> {
    let mlx = checkpoint.mlx_format();
    let mut files: Vec<PathBuf> = Vec::new();
    for p in parameters {
        let name = p.name.as_str();
        let key = aliases.get(name).cloned().unwrap_or_else(|| name.to_owned());
        let Some(entry) = checkpoint.get(&key) else { continue };
        let declared: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
        match stored_layout(&declared, &entry.shape, Some(mlx)) {
            Ok(StoredLayout::AsDeclared) => {}
            Ok(StoredLayout::ChannelsLast) => {
                let file = transposed_file(&checkpoint, &key, &declared, derived)?;
                files.push(file);
                aliases.insert(name.to_owned(), derived_key(&key));
            }
            Err(why) => bail!("checkpoint tensor `{key}` {why}"),
        }
    }
    if files.is_empty() {
        return Ok((checkpoint, aliases));
    }
    let all: Vec<PathBuf> = checkpoint.files().iter().cloned().chain(files).collect();
    Ok((Checkpoint::from_files(all)?, aliases))
}

/// The key a transposed copy of `key` is served under.
fn derived_key(key: &str) -> String {
    format!("{key}#declared-layout")
}

/// Bytes per element of the float dtypes weights are stored in.
fn element_size(dtype: &str) -> Option<usize> {
    match dtype {
        "F32" => Some(4),
        "BF16" | "F16" => Some(2),
        _ => None,
    }
}

/// `[out, k..., in]` → `[out, in, k...]`, element by element.
fn to_channels_first(bytes: &[u8], declared: &[usize], size: usize) -> Vec<u8> {
    let (out, inputs) = (declared[0], declared[1]);
    let kernel: usize = declared[2..].iter().product();
    let mut moved = vec![0u8; bytes.len()];
    for o in 0..out {
        for k in 0..kernel {
            for i in 0..inputs {
                let from = ((o * kernel + k) * inputs + i) * size;
                let to = ((o * inputs + i) * kernel + k) * size;
                moved[to..to + size].copy_from_slice(&bytes[from..from + size]);
            }
        }
    }
    moved
}

/// Writes (once; the name is a digest of the source tensor's place and size) a safetensors
/// file holding `key` transposed into `declared`, its data 64-byte aligned so IREE maps it.
fn transposed_file(checkpoint: &Checkpoint, key: &str, declared: &[usize], dir: &Path) -> Result<PathBuf> {
    let entry = checkpoint.get(key).context("invariant: the tensor was found")?;
    let size = element_size(&entry.dtype)
        .with_context(|| format!("checkpoint tensor `{key}` is {}, not a float kernel", entry.dtype))?;
    let source = &checkpoint.files()[entry.file];
    let modified = std::fs::metadata(source).and_then(|m| m.modified()).ok();
    let mut h = sha2::Sha256::new();
    h.update(format!("{}|{key}|{:?}|{:?}|{modified:?}|{declared:?}", source.display(), entry.offsets, entry.shape));
    let path = dir.join(format!("{}.safetensors", hex::encode(&h.finalize()[..16])));
    if path.is_file() {
        return Ok(path);
    }
    let moved = to_channels_first(&checkpoint.read(key)?, declared, size);
    let header = serde_json::json!({
        derived_key(key): { "dtype": entry.dtype, "shape": declared, "data_offsets": [0, moved.len()] },
        "__metadata__": { "format": "pt", "derived_from": format!("{key} (channels-last)") },
    })
    .to_string();
    // Pad the header with spaces so the data starts at a multiple of 64 bytes.
    let padded = (8 + header.len()).div_ceil(64) * 64 - 8;
    let mut bytes = Vec::with_capacity(8 + padded + moved.len());
    bytes.extend_from_slice(&(padded as u64).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(8 + padded, b' ');
    bytes.extend_from_slice(&moved);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), hex::encode(&sha2::Sha256::digest(key)[..4])));
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&bytes).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_last_kernels_move_to_channels_first() {
        // [out 2, kh 1, kw 2, in 3] with each value naming its (o, k, i).
        let declared = [2usize, 3, 1, 2];
        let mut stored = Vec::new();
        for o in 0..2u8 {
            for k in 0..2u8 {
                for i in 0..3u8 {
                    stored.push(o * 100 + k * 10 + i);
                }
            }
        }
        let moved = to_channels_first(&stored, &declared, 1);
        let want: Vec<u8> =
            (0..2u8).flat_map(|o| (0..3u8).flat_map(move |i| (0..2u8).map(move |k| o * 100 + k * 10 + i))).collect();
        assert_eq!(moved, want);
    }
}
