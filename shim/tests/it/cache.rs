//! The compile cache: hits, keys that follow every input, damaged entries
//! rebuilt, artifacts of another compiler refused.

use mlxcel_shim::{Artifact, CacheOutcome, CompileCache, CompileRequest, Error, Target};

use crate::support::compiler;

const NEG: &str = "func.func @neg(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = stablehlo.negate %x : tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n";

fn request<'a>(target: &'a Target, key_parts: &'a [String]) -> CompileRequest<'a> {
    CompileRequest { name: "neg", mlir: NEG, target, flags: &[], key_parts, contract: None }
}

#[test]
fn second_lookup_hits_and_keys_follow_every_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = CompileCache::new(dir.path());
    let host = Target::host_cpu();
    let (first, outcome) = cache.get_or_compile(compiler(), &request(&host, &[])).expect("compiles");
    assert_eq!(outcome, CacheOutcome::Compiled { replaced: false });
    let (again, outcome) = cache.get_or_compile(compiler(), &request(&host, &[])).expect("hits");
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(first.vmfb, again.vmfb);

    let rev = compiler().revision();
    let generic = Target::Cpu { cpu: "generic".into() };
    let contract = vec!["contract=2".to_owned()];
    let base = CompileCache::key(rev, &request(&host, &[]));
    assert_ne!(base, CompileCache::key(rev, &request(&generic, &[])), "target");
    assert_ne!(base, CompileCache::key(rev, &request(&host, &contract)), "key parts");
    assert_ne!(base, CompileCache::key("3.12.0 @ other", &request(&host, &[])), "compiler");
    let flags = vec!["--iree-opt-level=O1".to_owned()];
    let with_flags = CompileRequest { flags: &flags, ..request(&host, &[]) };
    assert_ne!(base, CompileCache::key(rev, &with_flags), "flags");
    let other_mlir = CompileRequest { mlir: "module {}", ..request(&host, &[]) };
    assert_ne!(base, CompileCache::key(rev, &other_mlir), "mlir");
}

#[test]
fn a_truncated_entry_is_detected_and_rebuilt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = CompileCache::new(dir.path());
    let host = Target::host_cpu();
    let (good, _) = cache.get_or_compile(compiler(), &request(&host, &[])).expect("compiles");
    let path = cache.entry_path(&good.meta.key);
    let bytes = std::fs::read(&path).expect("entry");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("truncate");
    let (rebuilt, outcome) = cache.get_or_compile(compiler(), &request(&host, &[])).expect("rebuilds");
    assert_eq!(outcome, CacheOutcome::Compiled { replaced: true });
    assert_eq!(rebuilt.vmfb, good.vmfb);
    assert_eq!(std::fs::read(&path).expect("entry"), bytes, "the entry is whole again");
    assert!(
        std::fs::read_dir(dir.path()).expect("dir").all(|e| !e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .starts_with(".tmp")),
        "no temporary files are left behind"
    );
}

#[test]
fn an_artifact_from_another_compiler_version_is_refused() {
    let foreign = Artifact::new("neg", "k", "3.12.0 @ 0123abcd", "llvm-cpu:generic", NEG, vec![0; 64]);
    let path = std::path::Path::new("foreign.mlxvmfb");
    let err = Artifact::from_bytes(path, &foreign.to_bytes(), compiler().revision()).unwrap_err();
    assert!(matches!(err, Error::ArtifactVersion { .. }), "{err}");
    assert!(err.to_string().contains("3.12.0"), "{err}");
}

#[test]
fn concurrent_writers_leave_one_whole_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Target::host_cpu();
    let results: Vec<Artifact> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let cache = CompileCache::new(dir.path());
                let host = &host;
                s.spawn(move || cache.get_or_compile(compiler(), &request(host, &[])).expect("compiles").0)
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let cache = CompileCache::new(dir.path());
    let (hit, outcome) = cache.get_or_compile(compiler(), &request(&host, &[])).expect("hits");
    assert_eq!(outcome, CacheOutcome::Hit);
    assert!(results.iter().all(|a| a.vmfb == hit.vmfb));
}

/// The numeric contract keys the entry and is written into it; an entry under the right key
/// that states another contract (a copied or edited cache) is refused, naming both, never run.
#[test]
fn an_entry_stating_another_numeric_contract_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = CompileCache::new(dir.path());
    let host = Target::host_cpu();
    let ours = CompileRequest { contract: Some("{\"version\":5}"), ..request(&host, &[]) };
    let rev = compiler().revision();
    assert_ne!(CompileCache::key(rev, &ours), CompileCache::key(rev, &request(&host, &[])), "contract keys");
    let (artifact, _) = cache.get_or_compile(compiler(), &ours).expect("compiles");
    assert_eq!(artifact.meta.contract.as_deref(), Some("{\"version\":5}"));
    let path = cache.entry_path(&CompileCache::key(rev, &ours));
    let mut edited = Artifact::from_bytes(&path, &std::fs::read(&path).expect("entry"), rev).expect("parses");
    edited.meta.contract = Some("{\"version\":4}".into());
    std::fs::write(&path, edited.to_bytes()).expect("write");
    let err = cache.get_or_compile(compiler(), &ours).expect_err("refused");
    assert!(matches!(err, Error::ContractMismatch { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("states {\"version\":4}, this run needs {\"version\":5}"), "{message}");
    edited.meta.contract = None;
    std::fs::write(&path, edited.to_bytes()).expect("write");
    let err = cache.get_or_compile(compiler(), &ours).expect_err("refused");
    assert!(err.to_string().contains("states none"), "{err}");
}

#[test]
fn a_read_only_cache_serves_its_entries_and_refuses_to_compile_or_repair() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Target::host_cpu();
    let read_only = CompileCache::read_only(dir.path());
    let err = read_only.get_or_compile(compiler(), &request(&host, &[])).unwrap_err();
    assert!(matches!(err, Error::ReadOnlyMiss { ref name, .. } if name == "neg"), "{err}");
    assert!(err.to_string().contains("mlxcel-host compile"), "says how to build it: {err}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "nothing written");

    // Built ahead by a writable cache on the same directory, then served as it is.
    let (built, _) = CompileCache::new(dir.path()).get_or_compile(compiler(), &request(&host, &[])).expect("builds");
    let (served, outcome) = read_only.get_or_compile(compiler(), &request(&host, &[])).expect("hits");
    assert_eq!((outcome, served.vmfb), (CacheOutcome::Hit, built.vmfb));

    // A damaged entry is refused, not rebuilt.
    let path = read_only.entry_path(&built.meta.key);
    let bytes = std::fs::read(&path).expect("entry");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("truncate");
    let err = read_only.get_or_compile(compiler(), &request(&host, &[])).unwrap_err();
    assert!(matches!(err, Error::ReadOnlyMiss { .. }), "{err}");
    assert_eq!(std::fs::read(&path).expect("entry").len(), bytes.len() / 2, "left as it was");
}
