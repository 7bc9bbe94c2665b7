//! A `model.safetensors` file through the shim's checkpoint reader (`shim/src/checkpoint.rs`,
//! `Checkpoint::open` on a directory holding it): the header's length, JSON, dtypes, shapes
//! and offsets checked against the file. Every tensor it accepts must then read back whole.

#![no_main]

use mlxcel_fuzz::checkpoint::Checkpoint;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = mlxcel_fuzz::scratch();
    mlxcel_fuzz::put(dir, "model.safetensors.index.json", None);
    mlxcel_fuzz::put(dir, "model.safetensors", Some(data));
    let Ok(ckpt) = Checkpoint::open(dir) else { return };
    let _ = (ckpt.mlx_format(), ckpt.file_aligned(0, 64), ckpt.describe_files());
    for (key, entry) in ckpt.tensors() {
        let _ = entry.desc();
        let bytes = ckpt.read(key).unwrap_or_else(|e| panic!("{key:?} was accepted but does not read: {e}"));
        assert_eq!(bytes.len() as u64, entry.offsets.1 - entry.offsets.0);
    }
});
