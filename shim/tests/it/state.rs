//! Module state across calls: several exports sharing one packed mutable
//! global (the shape the KV cache takes), and the guard against IREE 3.13's
//! `FuseGlobalsPass` merging state buffers that only `dynamic_update_slice`
//! writes.

use mlxcel_shim::{HostTensor, Session};

use crate::support::{DRIVERS, compile, session};

/// K and V for 8 positions of width 4, packed in one global [2, 8, 4].
const PACKED: &str = r#"
module @kv {
  util.global private mutable @cache = dense<0.0> : tensor<2x8x4xf32>
  func.func @write(%which: tensor<i32>, %pos: tensor<i32>, %row: tensor<1x1x4xf32>) {
    %z = stablehlo.constant dense<0> : tensor<i32>
    %c = util.global.load @cache : tensor<2x8x4xf32>
    %u = stablehlo.dynamic_update_slice %c, %row, %which, %pos, %z : (tensor<2x8x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x4xf32>
    util.global.store %u, @cache : tensor<2x8x4xf32>
    return
  }
  func.func @read(%which: tensor<i32>) -> tensor<8x4xf32> {
    %z = stablehlo.constant dense<0> : tensor<i32>
    %c = util.global.load @cache : tensor<2x8x4xf32>
    %s = stablehlo.dynamic_slice %c, %which, %z, %z, sizes = [1, 8, 4] : (tensor<2x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x8x4xf32>
    %r = stablehlo.reshape %s : (tensor<1x8x4xf32>) -> tensor<8x4xf32>
    return %r : tensor<8x4xf32>
  }
  func.func @reset() {
    %zero = stablehlo.constant dense<0.0> : tensor<2x8x4xf32>
    util.global.store %zero, @cache : tensor<2x8x4xf32>
    return
  }
}
"#;

fn read(s: &Session, which: i32) -> Vec<f32> {
    let w = HostTensor::scalar(which);
    s.call("kv.read", &[(&w).into()]).expect("read").remove(0).to_host().expect("host").to_vec().expect("f32")
}

fn write(s: &Session, which: i32, pos: i32, row: [f32; 4]) {
    let (w, p) = (HostTensor::scalar(which), HostTensor::scalar(pos));
    let row = HostTensor::from_slice(vec![1, 1, 4], &row).expect("row");
    let out = s.call("kv.write", &[(&w).into(), (&p).into(), (&row).into()]).expect("write");
    assert!(out.is_empty());
}

#[test]
fn exports_share_one_packed_global() {
    let artifact = compile("kv", PACKED);
    for driver in DRIVERS {
        let s = session(driver, &artifact);
        write(&s, 0, 2, [1.0, 2.0, 3.0, 4.0]);
        write(&s, 1, 2, [-1.0, -2.0, -3.0, -4.0]);
        write(&s, 0, 7, [9.0, 9.0, 9.0, 9.0]);
        let (k, v) = (read(&s, 0), read(&s, 1));
        let mut want_k = vec![0.0f32; 32];
        want_k[8..12].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        want_k[28..32].copy_from_slice(&[9.0; 4]);
        let mut want_v = vec![0.0f32; 32];
        want_v[8..12].copy_from_slice(&[-1.0, -2.0, -3.0, -4.0]);
        assert_eq!((k, v), (want_k, want_v), "{driver:?}");

        // A second session of the same module has its own state.
        let other = session(driver, &artifact);
        assert_eq!(read(&other, 0), vec![0.0; 32]);

        s.call("kv.reset", &[]).expect("reset");
        assert_eq!(read(&s, 0), vec![0.0; 32]);
    }
}

/// Two state buffers, each written only by `dynamic_update_slice` in its own
/// function; `diff` returns a - b. `{init_a}`/`{init_b}` are the initialisers.
fn two_buffers(init_a: &str, init_b: &str) -> String {
    format!(
        r#"
module @two {{
  util.global private mutable @a = dense<{init_a}> : tensor<8x4xf32>
  util.global private mutable @b = dense<{init_b}> : tensor<8x4xf32>
  func.func @fa(%x: tensor<2x4xf32>) {{
    %z = stablehlo.constant dense<0> : tensor<i32>
    %a = util.global.load @a : tensor<8x4xf32>
    %u = stablehlo.dynamic_update_slice %a, %x, %z, %z : (tensor<8x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    util.global.store %u, @a : tensor<8x4xf32>
    return
  }}
  func.func @fb(%x: tensor<2x4xf32>) {{
    %z = stablehlo.constant dense<0> : tensor<i32>
    %b = util.global.load @b : tensor<8x4xf32>
    %u = stablehlo.dynamic_update_slice %b, %x, %z, %z : (tensor<8x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    util.global.store %u, @b : tensor<8x4xf32>
    return
  }}
  func.func @diff() -> tensor<2x4xf32> {{
    %a = util.global.load @a : tensor<8x4xf32>
    %b = util.global.load @b : tensor<8x4xf32>
    %d = stablehlo.subtract %a, %b : tensor<8x4xf32>
    %r = stablehlo.slice %d [0:2, 0:4] : (tensor<8x4xf32>) -> tensor<2x4xf32>
    return %r : tensor<2x4xf32>
  }}
}}
"#
    )
}

fn diff_after_writes(mlir: &str) -> Vec<f32> {
    let s = session(mlxcel_shim::Driver::LocalSync, &compile("two", mlir));
    let a = HostTensor::from_slice(vec![2, 4], &[5.0f32; 8]).expect("a");
    let b = HostTensor::from_slice(vec![2, 4], &[2.0f32; 8]).expect("b");
    s.call("two.fa", &[(&a).into()]).expect("fa");
    s.call("two.fb", &[(&b).into()]).expect("fb");
    s.call("two.diff", &[]).expect("diff").remove(0).to_host().expect("host").to_vec().expect("f32")
}

/// The convention every stateful module follows (a packed global, or
/// distinct initialisers): the two buffers stay two buffers.
#[test]
fn state_buffers_with_distinct_initialisers_do_not_alias() {
    assert_eq!(diff_after_writes(&two_buffers("1.0e-30", "2.0e-30")), vec![3.0f32; 8]);
}

/// IREE 3.13 fuses identically initialised DUS-only globals into one buffer
/// (b reads a's writes). If this starts failing, the compiler was fixed or
/// changed: re-check the KV-cache convention before relaxing it.
#[test]
fn iree_3_13_still_fuses_identically_initialised_globals() {
    let d = diff_after_writes(&two_buffers("0.0", "0.0"));
    assert_eq!(d, vec![0.0f32; 8], "the FuseGlobalsPass miscompile changed; see ARCHITECTURE.md");
}
