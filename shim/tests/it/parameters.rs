//! Weights as IREE parameters, served from safetensors files the test
//! writes: single file, a sharded pair with its index, and every way a
//! checkpoint can be wrong.

use std::path::Path;

use mlxcel_shim::{Checkpoint, Device, Driver, Error, HostTensor, Parameters, Session};

use crate::support::{DRIVERS, assert_close, compile, write_safetensors};

const AFFINE: &str = r#"
module @affine {
  util.global private @w = #flow.parameter.named<"model"::"layer.weight"> : tensor<4x4xf32>
  util.global private @b = #flow.parameter.named<"model"::"layer.bias"> : tensor<4xf32>
  func.func @apply(%x: tensor<1x4xf32>) -> tensor<1x4xf32> {
    %w = util.global.load @w : tensor<4x4xf32>
    %b = util.global.load @b : tensor<4xf32>
    %r = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<1x4xf32>, tensor<4x4xf32>) -> tensor<1x4xf32>
    %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
    %o = stablehlo.add %r, %bb : tensor<1x4xf32>
    return %o : tensor<1x4xf32>
  }
}
"#;

fn weight() -> Vec<f32> {
    (0..16).map(|i| i as f32 * 0.5 - 3.0).collect()
}

fn bias() -> Vec<f32> {
    vec![0.25, -1.0, 2.0, 0.0]
}

/// x W^T + b, as a torch Linear computes it.
fn by_hand(x: &[f32]) -> Vec<f32> {
    let (w, b) = (weight(), bias());
    (0..4).map(|o| (0..4).map(|i| x[i] * w[o * 4 + i]).sum::<f32>() + b[o]).collect()
}

fn run(ckpt: &Path, driver: Driver) -> Result<Vec<f32>, Error> {
    let device = Device::new(driver)?;
    let params = Parameters::new("model", Checkpoint::open(ckpt)?)?;
    let artifact = compile("affine", AFFINE);
    let session = Session::new(&device, Some(&params), &[&artifact])?;
    let x = HostTensor::from_slice(vec![1, 4], &[1.0f32, -2.0, 0.5, 3.0])?;
    session.call("affine.apply", &[(&x).into()])?.remove(0).to_host()?.to_vec()
}

#[test]
fn a_single_safetensors_file_serves_the_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[("layer.weight", vec![4, 4], weight()), ("layer.bias", vec![4], bias())],
    );
    for driver in DRIVERS {
        let got = run(dir.path(), driver).expect("runs");
        assert_close(&got, &by_hand(&[1.0, -2.0, 0.5, 3.0]), 1e-5);
    }
}

fn write_sharded(dir: &Path) {
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), &[("layer.weight", vec![4, 4], weight())]);
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), &[("layer.bias", vec![4], bias())]);
    let index = r#"{"metadata": {"total_size": 80}, "weight_map": {
        "layer.weight": "model-00001-of-00002.safetensors",
        "layer.bias": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(dir.join("model.safetensors.index.json"), index).expect("index");
}

#[test]
fn a_sharded_checkpoint_serves_the_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_sharded(dir.path());
    let got = run(dir.path(), Driver::LocalSync).expect("runs");
    assert_close(&got, &by_hand(&[1.0, -2.0, 0.5, 3.0]), 1e-5);
}

#[test]
fn a_missing_shard_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_sharded(dir.path());
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).expect("rm");
    let err = run(dir.path(), Driver::LocalSync).unwrap_err();
    assert!(matches!(err, Error::CheckpointIo { .. }), "{err}");
    assert!(err.to_string().contains("model-00002-of-00002.safetensors"), "{err}");
}

#[test]
fn an_index_that_misplaces_a_tensor_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_sharded(dir.path());
    let index = r#"{"weight_map": {"layer.weight": "model-00002-of-00002.safetensors",
        "layer.bias": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(dir.path().join("model.safetensors.index.json"), index).expect("index");
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("does not hold it"), "{err}");
}

#[test]
fn an_index_naming_a_shard_outside_the_checkpoint_is_refused_before_it_is_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_sharded(dir.path());
    let outside = dir.path().join("elsewhere");
    std::fs::create_dir(&outside).expect("dir");
    write_sharded(&outside);
    let checkpoint = dir.path().join("checkpoint");
    std::fs::create_dir(&checkpoint).expect("dir");
    for shard in ["../model-00002-of-00002.safetensors", "/etc/passwd", "elsewhere/../x.safetensors"] {
        let index = format!(r#"{{"weight_map": {{"layer.weight": "{shard}"}}}}"#);
        std::fs::write(checkpoint.join("model.safetensors.index.json"), index).expect("index");
        let err = Checkpoint::open(&checkpoint).unwrap_err();
        assert!(err.to_string().contains("is not a file name in the checkpoint's directory"), "{shard}: {err}");
    }
}

#[test]
fn a_truncated_file_is_refused_before_iree_sees_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.safetensors");
    write_safetensors(&path, &[("layer.weight", vec![4, 4], weight()), ("layer.bias", vec![4], bias())]);
    let bytes = std::fs::read(&path).expect("read");
    std::fs::write(&path, &bytes[..bytes.len() - 5]).expect("truncate");
    let err = run(dir.path(), Driver::LocalSync).unwrap_err();
    assert!(matches!(err, Error::CheckpointFormat { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
    // A file cut inside its header, and one that is not safetensors at all.
    std::fs::write(&path, &bytes[..20]).expect("truncate");
    assert!(matches!(Checkpoint::open(&path), Err(Error::CheckpointFormat { .. })));
    std::fs::write(&path, b"{\"not\": \"safetensors\"}").expect("garbage");
    assert!(matches!(Checkpoint::open(&path), Err(Error::CheckpointFormat { .. })));
}

#[test]
fn a_missing_checkpoint_is_an_io_error() {
    let err = Checkpoint::open("/nonexistent/model.safetensors").unwrap_err();
    assert!(matches!(err, Error::CheckpointIo { .. }), "{err}");
    let empty = tempfile::tempdir().expect("tempdir");
    let err = Checkpoint::open(empty.path()).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn a_missing_parameter_key_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_safetensors(&dir.path().join("model.safetensors"), &[("layer.weight", vec![4, 4], weight())]);
    let err = run(dir.path(), Driver::LocalSync).unwrap_err();
    assert!(matches!(&err, Error::ParameterMissing { key, .. } if key == "layer.bias"), "{err}");
}

#[test]
fn a_parameter_of_the_wrong_shape_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[("layer.weight", vec![2, 8], weight()), ("layer.bias", vec![4], bias())],
    );
    let err = run(dir.path(), Driver::LocalSync).unwrap_err();
    assert!(matches!(&err, Error::ParameterMismatch { key, .. } if key == "layer.weight"), "{err}");
}

#[test]
fn a_module_with_parameters_needs_a_provider() {
    let device = Device::new(Driver::LocalSync).expect("device");
    let artifact = compile("affine", AFFINE);
    let err = Session::new(&device, None, &[&artifact]).unwrap_err();
    assert!(matches!(err, Error::ParameterScope { .. }), "{err}");
}

/// Writes `model.safetensors` by hand with its data section starting at byte
/// `start` (the header padded with spaces), the weight then the bias.
fn write_with_data_start(path: &Path, start: usize) {
    let json = r#"{"layer.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]},"layer.bias":{"dtype":"F32","shape":[4],"data_offsets":[64,80]}}"#;
    assert!(start >= 8 + json.len() && start.is_multiple_of(8), "room for the header");
    let header = format!("{json:<width$}", width = start - 8);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(weight().iter().chain(&bias()).flat_map(|x| x.to_le_bytes()));
    std::fs::write(path, bytes).expect("write");
}

/// A file whose tensors all sit at 64-byte multiples is served from a
/// mapping (imported, no copy); one that is not is read as before. Both
/// give the same weights.
#[test]
fn aligned_files_are_mapped_and_unaligned_ones_read_with_the_same_result() {
    for (start, aligned) in [(192, true), (200, false)] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_with_data_start(&dir.path().join("model.safetensors"), start);
        let ckpt = Checkpoint::open(dir.path()).expect("checkpoint");
        assert_eq!(ckpt.file_aligned(0, 64), aligned, "data at {start}");
        for driver in DRIVERS {
            let got = run(dir.path(), driver).expect("runs");
            assert_close(&got, &by_hand(&[1.0, -2.0, 0.5, 3.0]), 1e-5);
        }
    }
}

/// A module naming its weights by logical names reads the checkpoint's tensors through
/// aliases: the same bytes under a second key, across shards.
#[test]
fn aliases_serve_checkpoint_tensors_under_the_names_a_module_uses() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_safetensors(&dir.path().join("model-00001-of-00002.safetensors"), &[("model.tower.w", vec![4, 4], weight())]);
    write_safetensors(&dir.path().join("model-00002-of-00002.safetensors"), &[("model.tower.b", vec![4], bias())]);
    let index = r#"{"metadata": {"total_size": 80}, "weight_map": {
        "model.tower.w": "model-00001-of-00002.safetensors",
        "model.tower.b": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(dir.path().join("model.safetensors.index.json"), index).expect("index");
    let aliases = |pairs: &[(&str, &str)]| pairs.iter().map(|(a, k)| ((*a).to_owned(), (*k).to_owned())).collect();
    let open = || Checkpoint::open(dir.path()).expect("checkpoint");

    let params = Parameters::with_aliases(
        "model",
        open(),
        aliases(&[("layer.weight", "model.tower.w"), ("layer.bias", "model.tower.b")]),
    )
    .expect("aliases");
    let device = Device::new(Driver::LocalSync).expect("device");
    let session = Session::new(&device, Some(&params), &[&compile("affine", AFFINE)]).expect("session");
    let x = HostTensor::from_slice(vec![1, 4], &[1.0f32, -2.0, 0.5, 3.0]).expect("x");
    let got: Vec<f32> = session
        .call("affine.apply", &[(&x).into()])
        .expect("call")
        .remove(0)
        .to_host()
        .expect("host")
        .to_vec()
        .expect("f32");
    assert_close(&got, &by_hand(&[1.0, -2.0, 0.5, 3.0]), 1e-5);

    let err = Parameters::with_aliases("model", open(), aliases(&[("layer.weight", "model.tower.nothing")]))
        .expect_err("an alias of a missing key");
    assert!(matches!(err, Error::ParameterMissing { .. }), "{err:?}");
    let err = Parameters::with_aliases("model", open(), aliases(&[("model.tower.b", "model.tower.w")]))
        .expect_err("an alias that is another tensor's key");
    assert!(matches!(err, Error::ParameterAlias { .. }), "{err:?}");
}
