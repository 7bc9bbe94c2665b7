//! What the Qwen-VL vision graphs share: the buckets of patch rows a graph is compiled for, the
//! inputs it declares (the processor's per-row tensors), and the attention masks that keep a row
//! within its own image, or within its own window of an image.
//!
//! Rows past an item's patches are the host's zero padding: their segment mark is 0, so they
//! attend only to each other and the real rows never see them.

use mlxcel_emit::{Compare, Elem, Func, Type, Value};
use mlxcel_plugin_api::{
    DType, EncoderGraph, EncoderGraphRequest, ErrorCode, Modality, PluginError, ShapeBucket, TensorSpec,
};

use super::PatchRows;
use super::processor::{PATCH_POSITIONS, PATCH_SEGMENTS, PIXEL_VALUES, SEGMENT_START};

/// The graph's output, placed by the contract.
pub const FEATURES: &str = "image_features";
/// The smallest bucket, in patch rows; the next ones are every power of two
/// times it and one and a half times each, so an image's rows are padded by
/// less than half (attention costs the square of that). Each bucket is
/// compiled the first time an image needs it, then cached.
const SMALLEST_BUCKET: usize = 64;

/// Patch-row counts of the buckets: 64, 96, 128, 192, 256, ... (see [`SMALLEST_BUCKET`]) until
/// the processor's largest image fits. All are multiples of the 2x2 merge.
pub fn bucket_sizes(config: &impl PatchRows) -> Vec<usize> {
    let patch = config.geometry().patch_size;
    let area = (patch * patch) as u64;
    let most = config.max_pixels().div_ceil(area.max(1)) as usize;
    let mut sizes = vec![SMALLEST_BUCKET];
    while let Some(&n) = sizes.last().filter(|&&n| n < most) {
        // n is a power of two times 64, or 1.5 times one.
        let next = if n.is_power_of_two() { n + n / 2 } else { n / 3 * 4 };
        sizes.push(next);
    }
    sizes
}

fn bucket_id(n: usize) -> String {
    format!("patches-{n}")
}

/// A per-row encoder input a family adds to the processor's three: `[n, width]` of `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct RowInput {
    pub name: &'static str,
    pub dtype: DType,
    pub width: usize,
}

/// A family's vision graph signature beyond what every Qwen-VL tower takes and gives: its extra
/// per-row inputs (after `pixel_values`, `patch_positions` and `patch_segments`) and its
/// outputs, every one `[n / merge^2, width]` f32 (the first is [`FEATURES`]).
#[derive(Debug, Clone)]
pub struct Signature {
    pub extra_inputs: Vec<RowInput>,
    pub outputs: Vec<String>,
    pub width: usize,
}

impl Signature {
    /// The plain tower's: no extra input, the features of `width` only.
    pub fn features(width: usize) -> Self {
        Signature { extra_inputs: Vec::new(), outputs: vec![FEATURES.to_owned()], width }
    }

    /// The graph's inputs for a bucket of `n` patch rows.
    fn inputs(&self, config: &impl PatchRows, n: usize) -> Vec<TensorSpec> {
        let n64 = n as u64;
        let mut specs = vec![
            TensorSpec::new(PIXEL_VALUES, DType::F32, &[n64, config.geometry().patch_width() as u64]),
            TensorSpec::new(PATCH_POSITIONS, DType::I32, &[n64, 2]),
            TensorSpec::new(PATCH_SEGMENTS, DType::I32, &[n64]),
        ];
        specs.extend(self.extra_inputs.iter().map(|i| TensorSpec::new(i.name, i.dtype, &[n64, i.width as u64])));
        specs
    }

    /// The emitted function's argument types for `n` rows, in input order.
    pub fn argument_types(&self, config: &impl PatchRows, n: usize) -> Vec<Type> {
        self.inputs(config, n)
            .iter()
            .map(|spec| {
                let elem = match spec.dtype {
                    DType::I32 => Elem::I32,
                    _ => Elem::F32,
                };
                Type::new(elem, &spec.shape.iter().map(|&d| d as usize).collect::<Vec<_>>())
            })
            .collect()
    }
}

/// The image buckets; `family` names the plugin in the refusal of another modality.
pub fn buckets(
    config: &impl PatchRows,
    signature: &Signature,
    modality: Modality,
    family: &str,
) -> Result<Vec<ShapeBucket>, PluginError> {
    if modality != Modality::Image {
        return Err(PluginError::unsupported(format!("{family} has no {} encoder", modality.as_str())));
    }
    Ok(bucket_sizes(config)
        .into_iter()
        .map(|n| ShapeBucket { id: bucket_id(n).into(), inputs: signature.inputs(config, n).into() })
        .collect())
}

/// The patch rows of the bucket `request` names.
fn requested_rows(config: &impl PatchRows, request: &EncoderGraphRequest) -> Result<usize, PluginError> {
    bucket_sizes(config)
        .into_iter()
        .find(|&n| bucket_id(n) == request.bucket.as_str() && request.modality == Modality::Image)
        .ok_or_else(|| PluginError::unsupported(format!("no image encoder bucket `{}`", request.bucket)))
}

/// The encoder graph for the bucket `request` names: `emit(n)` writes the module for `n` patch
/// rows reading the weights `parameters` (logical name and shape, in declaration order), with
/// the inputs and outputs of `signature`.
pub fn encoder_graph(
    config: &impl PatchRows,
    signature: &Signature,
    request: &EncoderGraphRequest,
    parameters: &[(String, Vec<usize>)],
    emit: impl FnOnce(usize) -> Result<String, mlxcel_emit::EmitError>,
) -> Result<EncoderGraph, PluginError> {
    let n = requested_rows(config, request)?;
    let stablehlo = emit(n).map_err(|e| PluginError::new(ErrorCode::Internal, e.to_string()))?;
    let rows = (n / config.geometry().merge_area()) as u64;
    Ok(EncoderGraph {
        bucket: request.bucket.clone(),
        stablehlo: stablehlo.into(),
        entry_function: "main".into(),
        parameter_scope: "model".into(),
        parameters: crate::vit::parameter_specs(parameters, config.weights()),
        inputs: signature.inputs(config, n).into(),
        outputs: signature
            .outputs
            .iter()
            .map(|name| TensorSpec::new(name, DType::F32, &[rows, signature.width as u64]))
            .collect(),
    })
}

/// Per row, which image it belongs to, as an i32 `[n]`: the count of image starts at or before
/// it, doubled, plus one for real rows, so padding rows never share a key with real ones.
pub fn image_keys(f: &mut Func, segments: &Value) -> Value {
    let n = segments.shape()[0];
    let i32s = Type::new(Elem::I32, &[n, n]);
    let rows = f.iota(&i32s, 0);
    let cols = f.iota(&i32s, 1);
    let two = f.splat(segments.ty(), f64::from(SEGMENT_START));
    let starts = f.compare(Compare::Eq, segments, &two);
    let one = f.splat(segments.ty(), 1.0);
    let zero = f.splat(segments.ty(), 0.0);
    let start = f.select(&starts, &one, &zero);
    let before = f.compare(Compare::Le, &cols, &rows);
    let sb = f.broadcast(&start, &[n, n], &[1]);
    let zeros = f.splat(&i32s, 0.0);
    let counted = f.select(&before, &sb, &zeros);
    let image = f.reduce(&counted, &[1], mlxcel_emit::Reduce::Sum);
    let real = f.compare(Compare::Gt, segments, &zero);
    let realv = f.select(&real, &one, &zero);
    let doubled = f.add(&image, &image);
    f.add(&doubled, &realv)
}

/// Per row, which `side x side`-patch window of its image it lies in, as two i32 `[n]` keys
/// (window row, window column) from the rows' patch positions `[n, 2]`. The reference cuts each
/// image's merged grid into windows from its top-left corner, the last ones cut short where the
/// grid does not divide (its padding is dropped before attention), which is `position / side`.
pub fn window_keys(f: &mut Func, positions: &Value, side: usize) -> [Value; 2] {
    let n = positions.shape()[0];
    let s = f.splat(&Type::new(Elem::I32, &[n]), side as f64);
    [0, 1].map(|axis| {
        let p = f.slice(positions, &[0, axis], &[n, axis + 1]);
        let p = f.reshape(&p, &[n]);
        f.div(&p, &s)
    })
}

/// The additive mask `[n, n]`: 0 where two rows agree on every key, negative infinity elsewhere.
pub fn same_keys_mask(f: &mut Func, keys: &[&Value]) -> Value {
    let n = keys[0].shape()[0];
    let mut same: Option<Value> = None;
    for key in keys {
        let kr = f.broadcast(key, &[n, n], &[0]);
        let kc = f.broadcast(key, &[n, n], &[1]);
        let eq = f.compare(Compare::Eq, &kr, &kc);
        same = Some(match same {
            // `all && eq`: eq where all rows so far agree, else their (false) verdict.
            Some(all) => f.select(&all, &eq, &all),
            None => eq,
        });
    }
    let same = same.expect("invariant: at least one key");
    let f32s = Type::new(Elem::F32, &[n, n]);
    let open = f.splat(&f32s, 0.0);
    let shut = f.splat(&f32s, f64::NEG_INFINITY);
    f.select(&same, &open, &shut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen_vl::testing::fixture_config;

    #[test]
    fn buckets_grow_by_halves_until_the_largest_image_fits() {
        let mut config = fixture_config("qwen2_vl");
        // 12544 pixels / 196 = 64 patches.
        assert_eq!(bucket_sizes(&config), [64]);
        config.processor.max_pixels = 28 * 28 * 1280;
        let want = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144];
        assert_eq!(bucket_sizes(&config), want);
        assert!(want.iter().all(|n| n % 4 == 0), "whole 2x2 merge groups");
    }
}
