//! `model.safetensors.index.json` through the shim's checkpoint reader
//! (`Checkpoint::from_shard_index`, via `Checkpoint::open`): the input is the index, then after
//! a NUL an optional shard `fuzz.safetensors`; two valid shards, `a.safetensors` (tensors `a`,
//! `b`) and `b.safetensors` (`c`), are always beside it.

#![no_main]

use std::sync::Once;

use mlxcel_fuzz::checkpoint::Checkpoint;

/// A safetensors file of F32 tensors of two elements each.
fn shard(names: &[&str]) -> Vec<u8> {
    let entries: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("\"{n}\":{{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[{},{}]}}", 8 * i, 8 * i + 8))
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + 8 * names.len(), 0);
    out
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    static SHARDS: Once = Once::new();
    let dir = mlxcel_fuzz::scratch();
    SHARDS.call_once(|| {
        mlxcel_fuzz::put(dir, "a.safetensors", Some(&shard(&["a", "b"])));
        mlxcel_fuzz::put(dir, "b.safetensors", Some(&shard(&["c"])));
    });
    let files = mlxcel_fuzz::parts(data, 2);
    // The index names its shards by path relative to the checkpoint; one naming a file
    // elsewhere (an absolute path, a device) would have the fuzzer read this machine's files.
    if let Ok(index) = serde_json::from_slice::<serde_json::Value>(files[0])
        && let Some(map) = index.get("weight_map").and_then(|m| m.as_object())
        && map.values().any(|v| v.as_str().is_some_and(|f| f.contains('/')))
    {
        return;
    }
    mlxcel_fuzz::put(dir, "model.safetensors.index.json", Some(files[0]));
    mlxcel_fuzz::put(dir, "fuzz.safetensors", files.get(1).copied());
    let Ok(ckpt) = Checkpoint::open(dir) else { return };
    for (key, entry) in ckpt.tensors() {
        let bytes = ckpt.read(key).unwrap_or_else(|e| panic!("{key:?} was accepted but does not read: {e}"));
        assert_eq!(bytes.len() as u64, entry.offsets.1 - entry.offsets.0);
    }
});
