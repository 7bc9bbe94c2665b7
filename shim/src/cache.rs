//! The on-disk compile cache. An entry is keyed by a hash of everything that
//! can change the compiled code (the MLIR, compiler revision, flags, target,
//! and caller-supplied parts such as the numeric-contract version). Entries
//! are written to a temporary file and renamed into place, so concurrent
//! processes never see half an entry; a damaged entry is detected by its
//! checksum and rebuilt.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

use crate::{
    artifact::Artifact,
    compiler::{Compiler, Target},
    error::{Error, Result},
};

/// Bump when the entry format or key recipe changes.
/// v2: the numeric contract in the key and the header; parameter declarations keep their type
/// as written.
const CACHE_FORMAT: &str = "mlxcel-compile-cache-v2";

/// The environment variable naming a directory into which each module asked of the cache is
/// written as its MLIR, its flags and its tuning spec ([`crate::compiler::dump`]).
pub const DUMP_ENV: &str = "MLXCEL_DUMP_MLIR";

/// What to compile.
#[derive(Clone, Debug)]
pub struct CompileRequest<'a> {
    /// Names the module in messages and in the artifact.
    pub name: &'a str,
    pub mlir: &'a str,
    pub target: &'a Target,
    /// Extra compiler flags, after the target's.
    pub flags: &'a [String],
    /// Anything else the compiled code depends on.
    pub key_parts: &'a [String],
    /// The numeric contract the module was emitted under (its descriptor's JSON): part of the
    /// key, written into the artifact, and checked against a cached artifact's before it is
    /// returned.
    pub contract: Option<&'a str>,
}

/// Where an artifact came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    /// Compiled now; `replaced` when a damaged entry was found and rebuilt.
    Compiled {
        replaced: bool,
    },
}

/// A directory of compiled modules.
#[derive(Clone, Debug)]
pub struct CompileCache {
    dir: PathBuf,
    /// Never written: a miss is an error instead of a compile (a cache built ahead and mounted
    /// read-only).
    read_only: bool,
}

impl CompileCache {
    /// `$MLXCEL_CACHE_DIR`, else the user's cache dir (`~/.cache/mlxcel/compiled`).
    pub fn default_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("MLXCEL_CACHE_DIR") {
            return PathBuf::from(dir);
        }
        dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("mlxcel").join("compiled")
    }

    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into(), read_only: false }
    }

    /// A cache this process only reads: a request it holds no entry for is refused
    /// ([`Error::ReadOnlyMiss`]), never compiled.
    pub fn read_only(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into(), read_only: true }
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key of a request under a compiler revision.
    pub fn key(revision: &str, request: &CompileRequest<'_>) -> String {
        let mut h = Sha256::new();
        let mut field = |s: &str| {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        };
        field(CACHE_FORMAT);
        field(revision);
        field(&request.target.fingerprint());
        for f in request.flags {
            field(f);
        }
        field("--");
        for p in request.key_parts {
            field(p);
        }
        field("contract");
        field(request.contract.unwrap_or(""));
        field(request.mlir);
        hex::encode(h.finalize())
    }

    /// The path an entry is stored at.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.mlxvmfb"))
    }

    /// Returns the cached artifact for `request`, compiling and storing it
    /// on a miss or when the stored entry is damaged.
    pub fn get_or_compile(
        &self,
        compiler: &Compiler,
        request: &CompileRequest<'_>,
    ) -> Result<(Artifact, CacheOutcome)> {
        // For inspecting what the compiler is given: every module, whether compiled or cached.
        if let Some(dir) = std::env::var_os(DUMP_ENV) {
            crate::compiler::dump(Path::new(&dir), request.name, request.mlir, request.target, request.flags);
        }
        let key = CompileCache::key(compiler.revision(), request);
        let path = self.entry_path(&key);
        let mut replaced = false;
        match std::fs::read(&path) {
            Ok(bytes) => match Artifact::from_bytes(&path, &bytes, compiler.revision()) {
                Ok(artifact) if artifact.meta.key == key => {
                    // Refused, not rebuilt: an entry under this key with another contract was
                    // not written by this cache (a copied or edited compile cache).
                    if let Some(expected) = request.contract {
                        artifact.check_contract(expected)?;
                    }
                    return Ok((artifact, CacheOutcome::Hit));
                }
                Ok(_) => {
                    tracing::warn!(path = %path.display(), "cache entry has another key; rebuilding it");
                    replaced = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "damaged cache entry; rebuilding it");
                    replaced = true;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Cache { path, reason: e.to_string() }),
        }
        if self.read_only {
            return Err(Error::ReadOnlyMiss { dir: self.dir.clone(), name: request.name.to_owned() });
        }
        let vmfb = compiler.compile(request.name, request.mlir, request.target, request.flags)?;
        let mut artifact =
            Artifact::new(request.name, &key, compiler.revision(), &request.target.fingerprint(), request.mlir, vmfb);
        artifact.meta.contract = request.contract.map(str::to_owned);
        // A cache that cannot be written (read-only, full disk) costs a
        // recompile next time, not this request.
        if let Err(e) = self.store(&path, &artifact) {
            tracing::warn!(error = %e, "could not store a compiled module");
        }
        Ok((artifact, CacheOutcome::Compiled { replaced }))
    }

    /// Writes `artifact` to a unique temporary file and renames it into place.
    fn store(&self, path: &Path, artifact: &Artifact) -> Result<()> {
        let err = |reason: String| Error::Cache { path: path.to_owned(), reason };
        std::fs::create_dir_all(&self.dir).map_err(|e| err(format!("cannot create the cache directory: {e}")))?;
        let mut tmp = tempfile_in(&self.dir).map_err(|e| err(format!("cannot create a temporary file: {e}")))?;
        let result = (|| {
            tmp.1.write_all(&artifact.to_bytes())?;
            tmp.1.sync_all()?;
            std::fs::rename(&tmp.0, path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp.0);
            return Err(err(e.to_string()));
        }
        Ok(())
    }
}

/// Creates `<dir>/.tmp-<pid>-<n>` exclusively.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".tmp-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}
