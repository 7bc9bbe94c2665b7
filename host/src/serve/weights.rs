//! The checkpoint's weight files as the server loaded them. The decoder and the encoders read
//! their parameters from those files, so a file rewritten under a running server (a new
//! download or conversion into the same directory) would make it answer from weights nobody
//! chose, without an error. Each request first compares every file's size, modification time
//! and inode with the ones taken at start; on any difference the server refuses new work
//! (503, and `/ready` fails) until it is restarted on the new files.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use anyhow::Context as _;

/// What identifies one file's bytes without reading them.
#[derive(Clone, Debug, PartialEq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    device: u64,
    inode: u64,
}

impl Stamp {
    fn of(path: &Path) -> std::io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        Ok(Stamp { len: meta.len(), modified: meta.modified().ok(), device: meta.dev(), inode: meta.ino() })
    }
}

#[derive(Debug)]
pub(crate) struct WeightFiles {
    files: Vec<(PathBuf, Stamp)>,
    /// Set once a change is seen: it stays changed for the process's life.
    changed: AtomicBool,
}

impl WeightFiles {
    /// Every weight file of the checkpoint at `dir`, stamped now.
    pub(crate) fn take(dir: &Path) -> anyhow::Result<Self> {
        let checkpoint = mlxcel_shim::Checkpoint::open(dir)?;
        let files = checkpoint
            .files()
            .iter()
            .map(|f| Ok((f.clone(), Stamp::of(f).with_context(|| format!("reading {}", f.display()))?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(WeightFiles { files, changed: AtomicBool::new(false) })
    }

    /// `None` while every file is as loaded; else what changed.
    pub(crate) fn check(&self) -> Option<String> {
        for (path, stamp) in &self.files {
            let now = Stamp::of(path);
            if now.as_ref().ok() != Some(stamp) {
                let what = match now {
                    Err(e) => format!("{} can no longer be read ({e})", path.display()),
                    Ok(_) => format!("{} changed on disk since the server loaded it", path.display()),
                };
                if !self.changed.swap(true, Ordering::Relaxed) {
                    tracing::error!("{what}; refusing new requests until the server is restarted");
                }
                return Some(what);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewritten_or_removed_weight_file_is_seen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen2");
        for name in ["config.json", "model.safetensors"] {
            std::fs::copy(fixture.join(name), dir.path().join(name)).expect("copy");
        }
        let files = WeightFiles::take(dir.path()).expect("stamps");
        assert_eq!(files.check(), None);
        let weights = dir.path().join("model.safetensors");
        let mut bytes = std::fs::read(&weights).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        // Rewritten in place, the same size: the modification time tells.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&weights, &bytes).expect("write");
        assert!(files.check().is_some_and(|w| w.contains("changed on disk")));
        std::fs::remove_file(&weights).expect("remove");
        assert!(files.check().is_some_and(|w| w.contains("can no longer be read")));
    }
}
