//! FFI glue for linking mlx-rs on Linux x86_64, the one module of this crate allowed `unsafe`.
//!
//! mlx-rs 0.33.0 references five C symbols that nothing provides on Linux x86_64: mlx-c
//! defines its float16/bfloat16 accessors only on aarch64 (`HAS_FLOAT16`/`HAS_BFLOAT16` in
//! `half.h`), and `mach_approximate_time` is a macOS API (`RandomState::new` seeds with it).
//! Without them the binary does not link. The accessors forward to the uint16 ones: MLX's
//! `array::data<T>()` and `item<T>()` are reinterpreting casts with no dtype check, so the
//! bytes are the same. On aarch64 mlx-c defines the accessors itself, hence the `cfg`.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]
#![allow(unsafe_code)]

use mlx_sys::{bfloat16_t, float16_t, mlx_array};
use std::os::raw::c_int;

/// # Safety
/// As `mlx_array_item_uint16`: `res` points to writable 2 bytes and `arr` is a live array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx_array_item_float16(res: *mut float16_t, arr: mlx_array) -> c_int {
    // SAFETY: float16_t is 2 bytes, as u16; the caller's contract is forwarded unchanged.
    unsafe { mlx_sys::mlx_array_item_uint16(res.cast::<u16>(), arr) }
}

/// # Safety
/// As `mlx_array_item_uint16`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx_array_item_bfloat16(res: *mut bfloat16_t, arr: mlx_array) -> c_int {
    // SAFETY: bfloat16_t is u16; the caller's contract is forwarded unchanged.
    unsafe { mlx_sys::mlx_array_item_uint16(res.cast::<u16>(), arr) }
}

/// # Safety
/// As `mlx_array_data_uint16`: `arr` is a live, evaluated array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx_array_data_float16(arr: mlx_array) -> *const float16_t {
    // SAFETY: the caller's contract is forwarded unchanged; the pointer is only retyped.
    unsafe { mlx_sys::mlx_array_data_uint16(arr).cast::<float16_t>() }
}

/// # Safety
/// As `mlx_array_data_uint16`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx_array_data_bfloat16(arr: mlx_array) -> *const bfloat16_t {
    // SAFETY: the caller's contract is forwarded unchanged; the pointer is only retyped.
    unsafe { mlx_sys::mlx_array_data_uint16(arr).cast::<bfloat16_t>() }
}

/// The macOS clock `RandomState::new` seeds MLX's default key with; nanoseconds since the
/// epoch here. The oracles never use the default key (every operand is seeded in Rust).
#[unsafe(no_mangle)]
pub extern "C" fn mach_approximate_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// The version string of the libmlx this binary runs on (`mlx_version` from mlx-c).
pub fn mlx_version() -> Option<String> {
    // SAFETY: an mlx_string is created, filled by mlx_version, its NUL-terminated data copied
    // while it is alive, and freed once on every path.
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let status = mlx_sys::mlx_version(&mut s);
        let p = mlx_sys::mlx_string_data(s);
        let out = (status == 0 && !p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned());
        mlx_sys::mlx_string_free(s);
        out
    }
}
