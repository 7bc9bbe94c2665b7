//! Test fixture `testkit-faulty`: the Qwen2-VL family, delegated entry by entry, that misbehaves
//! in `preprocess` on images of chosen widths, so the server's fault handling is tested on a
//! real family's checkpoint beside requests it answers correctly.
//!
//! | image width | `preprocess` |
//! |---|---|
//! | [`PANICS`] | panics |
//! | [`STALLS`] | returns correctly after [`STALL`] (a call stuck past the host's deadline) |
//! | [`NAN`] | puts a NaN in `pixel_values` |
//! | [`SHORT`] | returns `pixel_values` 4 bytes short of its shape |
//! | any other | what Qwen2-VL returns |

#![forbid(unsafe_code)]

use std::time::Duration;

use mlxcel_family_qwen2_vl::{Qwen2Vl, Qwen2VlConfig};
use mlxcel_plugin_api::decoder::DecoderSpec;
use mlxcel_plugin_api::{
    CheckpointIndex, CheckpointReport, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, RVec, ShapeBucket,
};

/// Width of an image whose preprocessing panics.
pub const PANICS: u32 = 61;
/// Width of an image whose preprocessing takes [`STALL`].
pub const STALLS: u32 = 62;
/// Width of an image whose pixel values hold a NaN.
pub const NAN: u32 = 63;
/// Width of an image whose pixel values are short of their shape.
pub const SHORT: u32 = 65;
/// How long a stalled call takes.
pub const STALL: Duration = Duration::from_secs(6);

/// Qwen2-VL under the name `testkit-faulty`.
#[derive(Debug)]
pub struct Faulty;

impl FamilyPlugin for Faulty {
    type Config = Qwen2VlConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity { name: "testkit-faulty".into(), ..Qwen2Vl::identity() }
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Qwen2VlConfig>, PluginError> {
        Qwen2Vl::parse_config(config_json, processor_json)
    }

    fn prompt_layout(config: &Qwen2VlConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        Qwen2Vl::prompt_layout(config, request)
    }

    fn preprocess(
        config: &Qwen2VlConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        let width = match item {
            MediaItem::Rgb8 { width, .. } => Some(*width),
            _ => None,
        };
        if width == Some(PANICS) {
            panic!("this fixture panics on images {PANICS} pixels wide");
        }
        if width == Some(STALLS) {
            std::thread::sleep(STALL);
        }
        let mut preprocessed = Qwen2Vl::preprocess(config, item, options)?;
        let tensors = preprocessed.tensors.as_mut_slice();
        let pixels = tensors.iter_mut().find(|t| t.spec.dtype == DType::F32);
        match (width, pixels) {
            (Some(NAN), Some(pixels)) => pixels.data.as_mut_slice()[..4].copy_from_slice(&f32::NAN.to_le_bytes()),
            (Some(SHORT), Some(pixels)) => {
                let keep = pixels.data.len() - 4;
                pixels.data = RVec::from(&pixels.data.as_slice()[..keep]);
            }
            _ => {}
        }
        Ok(preprocessed)
    }

    fn encoder_buckets(config: &Qwen2VlConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        Qwen2Vl::encoder_buckets(config, modality)
    }

    fn encoder_graph(
        config: &Qwen2VlConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        Qwen2Vl::encoder_graph(config, request, target, compute)
    }

    fn prefill_program(config: &Qwen2VlConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        Qwen2Vl::prefill_program(config, request)
    }

    fn encoder_parameters(config: &Qwen2VlConfig) -> Vec<(String, Vec<usize>)> {
        Qwen2Vl::encoder_parameters(config)
    }

    fn encoder_weight_dtype(config: &Qwen2VlConfig) -> DType {
        Qwen2Vl::encoder_weight_dtype(config)
    }

    fn check_checkpoint(config: &Qwen2VlConfig, index: &CheckpointIndex) -> Result<CheckpointReport, PluginError> {
        Qwen2Vl::check_checkpoint(config, index)
    }

    fn decoder_spec(config: &Qwen2VlConfig) -> Result<Option<DecoderSpec>, PluginError> {
        Qwen2Vl::decoder_spec(config)
    }
}

mlxcel_plugin_api::export_plugin!(Faulty);
