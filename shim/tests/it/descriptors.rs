//! Every descriptor validation error, raised in Rust before any native call.

use mlxcel_shim::{DType, Error, HostTensor};

use crate::support::{compile, session};

const SIG: &str = r#"
func.func @f(%x: tensor<2x3xf32>, %n: tensor<i32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
"#;

fn check(args: &[HostTensor]) -> Error {
    let s = session(mlxcel_shim::Driver::LocalSync, &compile("sig", SIG));
    let name = &s.functions()[0].name.clone();
    let args: Vec<_> = args.iter().map(Into::into).collect();
    s.call(name, &args).expect_err("invalid arguments are refused")
}

fn x(shape: Vec<usize>, n: usize) -> HostTensor {
    HostTensor::from_slice(shape, &vec![1.0f32; n]).expect("valid")
}

#[test]
fn each_invalid_argument_gets_its_own_error() {
    let n = HostTensor::scalar(1i32);
    let wrong_dtype = HostTensor::from_slice(vec![2, 3], &[1i32; 6]).expect("valid");
    let cases: Vec<(Vec<HostTensor>, &str)> = vec![
        (vec![x(vec![2, 3], 6)], "ArgumentCount"),
        (vec![wrong_dtype, n.clone()], "DTypeMismatch"),
        (vec![x(vec![6], 6), n.clone()], "RankMismatch"),
        (vec![x(vec![3, 2], 6), n.clone()], "ShapeMismatch"),
        (vec![x(vec![2, 3], 6), x(vec![], 1)], "DTypeMismatch"),
    ];
    for (args, want) in cases {
        let err = check(&args);
        assert!(format!("{err:?}").starts_with(want), "want {want}, got {err:?}");
    }
}

#[test]
fn byte_counts_are_checked_when_a_tensor_is_made() {
    let err = HostTensor::from_bytes(DType::BF16, vec![3], vec![0; 5]).unwrap_err();
    assert!(matches!(err, Error::ByteCount { got: 5, want: 6, .. }), "{err}");
    assert!(err.to_string().contains("bf16"), "{err}");
}

#[test]
fn unknown_functions_list_what_is_exported() {
    let s = session(mlxcel_shim::Driver::LocalSync, &compile("sig", SIG));
    let err = s.call("sig.g", &[]).unwrap_err();
    assert!(matches!(err, Error::FunctionNotFound { .. }), "{err}");
    assert!(err.to_string().contains(".f"), "{err}");
}
