//! The plugin side: the plain Rust trait a family implements, and `export_plugin!`, which turns
//! an implementation into the exported ABI with every entry guarded by `catch_unwind`.
//!
//! **Architecture Invariant:** plugins are stateless. Every entry is an associated function
//! whose answer depends only on its arguments, so answers can be cached, hashed and compared
//! with goldens, and a panic in one request cannot leave state behind for the next.

use std::panic::{AssertUnwindSafe, catch_unwind};

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::abi::{PluginMod, PluginModRef, history};
use crate::types::{
    CheckpointIndex, CheckpointReport, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph,
    EncoderGraphRequest, EncoderTarget, ErrorCode, LayoutRequest, MediaItem, Modality, ModelConfig, PluginError,
    PluginIdentity, PrefillContract, PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};
use mlxcel_decoder::DecoderSpec;

/// A parsed checkpoint config: the facts the host needs and the family's typed view.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedConfig<C> {
    /// Family-independent facts.
    pub summary: ConfigSummary,
    /// The family's typed config; serialized to JSON at the boundary and handed back to every
    /// later entry.
    pub config: C,
}

/// One model family, implemented by a plugin crate and exported with [`export_plugin!`](crate::export_plugin).
///
/// Entries take the family's typed config (`Self::Config`), already deserialized from the
/// [`ModelConfig`] the host passes back. Return [`PluginError`]s for bad input; a panic is
/// caught at the boundary and reported as [`ErrorCode::Panicked`], but it is a bug.
pub trait FamilyPlugin: 'static {
    /// The family's typed view of `config.json` plus the processor config.
    type Config: Serialize + DeserializeOwned;

    /// Who the plugin is; must agree with the plugin's manifest.
    fn identity() -> PluginIdentity;

    /// Parses HF `config.json` and `preprocessor_config.json` text (the latter may be empty).
    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Self::Config>, PluginError>;

    /// Expands each item's placeholder in the rendered prompt.
    fn prompt_layout(config: &Self::Config, request: &LayoutRequest) -> Result<PromptLayout, PluginError>;

    /// Turns one image or audio item into encoder input tensors and grid metadata.
    fn preprocess(
        config: &Self::Config,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError>;

    /// The static shapes the encoder for `modality` can be compiled for, smallest first.
    fn encoder_buckets(config: &Self::Config, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError>;

    /// The encoder for one bucket, as StableHLO with named checkpoint parameters, laid out for
    /// `target` (the host's CPU, or [`EncoderTarget::unknown`]; since 1.3): the layout may
    /// follow the target, the results may not. It computes in `compute` (since 1.4; older hosts
    /// ask for [`EncoderCompute::F32`]); a family refuses a compute it does not offer
    /// ([`PluginError::unsupported`]).
    fn encoder_graph(
        config: &Self::Config,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError>;

    /// How features merge into the text embeddings for one tokenized request: the program
    /// the host runs (placements that replace or add rows at any tokens, per-item injections,
    /// positions, the mask).
    fn prefill_program(config: &Self::Config, request: &ContractRequest) -> Result<PrefillProgram, PluginError>;

    /// Every weight the family's encoder graphs read: logical name (`label/path`, as the
    /// graphs name them) and shape. The default is none; [`FamilyPlugin::check_checkpoint`]'s
    /// default holds the checkpoint to these.
    fn encoder_parameters(config: &Self::Config) -> Vec<(String, Vec<usize>)> {
        let _ = config;
        Vec::new()
    }

    /// The dtype the encoder graphs declare their weights in: the one the checkpoint stores
    /// them in (f32, or bf16 widened to f32 inside the graph). The default is f32.
    fn encoder_weight_dtype(config: &Self::Config) -> DType {
        let _ = config;
        DType::F32
    }

    /// Checks that a checkpoint has the tensors the encoder reads (since 1.1). The default
    /// resolves [`FamilyPlugin::encoder_parameters`] against the index and reports each
    /// module not found, each tensor missing, misshapen or not stored in
    /// [`FamilyPlugin::encoder_weight_dtype`].
    fn check_checkpoint(config: &Self::Config, index: &CheckpointIndex) -> Result<CheckpointReport, PluginError> {
        Ok(CheckpointReport::parameters(index, Self::encoder_parameters(config), Self::encoder_weight_dtype(config)))
    }

    /// The family's text decoder when it is not one of `mlxcel_decoder`'s presets, or is one
    /// with something the family's config decides (since 1.2): a spec built from the
    /// library's blocks (start from a preset in [`crate::decoder::presets`] and change what
    /// differs). The default, `None`, has the host read the preset for the checkpoint's text
    /// `model_type`.
    fn decoder_spec(config: &Self::Config) -> Result<Option<DecoderSpec>, PluginError> {
        let _ = config;
        Ok(None)
    }
}

/// Runs `f`, turning a panic into an [`ErrorCode::Panicked`] error naming the entry.
fn guard<R>(entry: &str, f: impl FnOnce() -> Result<R, PluginError>) -> RResult<R, PluginError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.into(),
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            RResult::RErr(PluginError::new(ErrorCode::Panicked, format!("plugin panicked in {entry}: {detail}")))
        }
    }
}

fn family_config<T: FamilyPlugin>(config: &ModelConfig) -> Result<T::Config, PluginError> {
    serde_json::from_str(config.family.as_str())
        .map_err(|e| PluginError::invalid(format!("model config is not this family's typed view: {e}")))
}

extern "C" fn identity<T: FamilyPlugin>() -> RResult<PluginIdentity, PluginError> {
    guard("identity", || Ok(T::identity()))
}

extern "C" fn parse_config<T: FamilyPlugin>(
    config_json: RStr<'_>,
    processor_json: RStr<'_>,
) -> RResult<ModelConfig, PluginError> {
    guard("parse_config", || {
        let parsed = T::parse_config(config_json.as_str(), processor_json.as_str())?;
        let family = serde_json::to_string(&parsed.config)
            .map_err(|e| PluginError::new(ErrorCode::Internal, format!("cannot serialize family config: {e}")))?;
        Ok(ModelConfig { summary: parsed.summary, family: family.into() })
    })
}

extern "C" fn prompt_layout<T: FamilyPlugin>(
    config: &ModelConfig,
    request: &LayoutRequest,
) -> RResult<PromptLayout, PluginError> {
    guard("prompt_layout", || T::prompt_layout(&family_config::<T>(config)?, request))
}

extern "C" fn preprocess<T: FamilyPlugin>(
    config: &ModelConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> RResult<Preprocessed, PluginError> {
    guard("preprocess", || {
        let out = T::preprocess(&family_config::<T>(config)?, item, options)?;
        // A tensor whose bytes do not match its shape must not reach the host's buffers.
        out.tensors.iter().try_for_each(|t| t.validate())?;
        Ok(out)
    })
}

extern "C" fn encoder_buckets<T: FamilyPlugin>(
    config: &ModelConfig,
    modality: Modality,
) -> RResult<RVec<ShapeBucket>, PluginError> {
    guard("encoder_buckets", || T::encoder_buckets(&family_config::<T>(config)?, modality).map(RVec::from))
}

/// The 1.0 entry, for a target not known: only hosts that predate 1.3 call it.
extern "C" fn encoder_graph<T: FamilyPlugin>(
    config: &ModelConfig,
    request: &EncoderGraphRequest,
) -> RResult<EncoderGraph, PluginError> {
    guard("encoder_graph", || {
        T::encoder_graph(&family_config::<T>(config)?, request, &EncoderTarget::unknown(), EncoderCompute::F32)
    })
}

/// The 1.3 entry, in f32: only 1.3 hosts call it.
extern "C" fn encoder_graph_for<T: FamilyPlugin>(
    config: &ModelConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> RResult<EncoderGraph, PluginError> {
    guard("encoder_graph_for", || T::encoder_graph(&family_config::<T>(config)?, request, target, EncoderCompute::F32))
}

extern "C" fn encoder_graph_compute<T: FamilyPlugin>(
    config: &ModelConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
    compute: EncoderCompute,
) -> RResult<EncoderGraph, PluginError> {
    guard("encoder_graph_compute", || T::encoder_graph(&family_config::<T>(config)?, request, target, compute))
}

/// The 1.0 entry, from the program: only hosts that predate 1.2 would call it, and they do not
/// load this plugin; the frozen tables of the testkit's older-minor fixtures do.
extern "C" fn prefill_contract<T: FamilyPlugin>(
    config: &ModelConfig,
    request: &ContractRequest,
) -> RResult<PrefillContract, PluginError> {
    guard("prefill_contract", || {
        let program = T::prefill_program(&family_config::<T>(config)?, request)?;
        PrefillContract::try_from(program)
            .map_err(|e| PluginError::unsupported(format!("the contract needs plugin-api 1.2's program form: {e}")))
    })
}

extern "C" fn prefill_program<T: FamilyPlugin>(
    config: &ModelConfig,
    request: &ContractRequest,
) -> RResult<PrefillProgram, PluginError> {
    guard("prefill_program", || T::prefill_program(&family_config::<T>(config)?, request))
}

extern "C" fn check_checkpoint<T: FamilyPlugin>(
    config: &ModelConfig,
    index: &CheckpointIndex,
) -> RResult<CheckpointReport, PluginError> {
    guard("check_checkpoint", || T::check_checkpoint(&family_config::<T>(config)?, index))
}

extern "C" fn decoder_spec<T: FamilyPlugin>(config: &ModelConfig) -> RResult<ROption<RString>, PluginError> {
    guard("decoder_spec", || {
        let spec = T::decoder_spec(&family_config::<T>(config)?)?;
        // What the host will refuse is refused here, where the plugin's author sees it first.
        if let Some(spec) = &spec {
            spec.validate().map_err(|e| PluginError::new(ErrorCode::Internal, e.to_string()))?;
        }
        Ok(spec.map(|s| RString::from(s.to_json())).into())
    })
}

/// The current root-module table for `T`; leaked once per library load.
pub(crate) fn current_table<T: FamilyPlugin>() -> PluginModRef {
    PluginMod {
        identity: identity::<T>,
        parse_config: parse_config::<T>,
        prompt_layout: prompt_layout::<T>,
        preprocess: preprocess::<T>,
        encoder_buckets: encoder_buckets::<T>,
        encoder_graph: encoder_graph::<T>,
        prefill_contract: prefill_contract::<T>,
        check_checkpoint: check_checkpoint::<T>,
        decoder_spec: decoder_spec::<T>,
        prefill_program: prefill_program::<T>,
        encoder_graph_for: encoder_graph_for::<T>,
        encoder_graph_compute: encoder_graph_compute::<T>,
    }
    .leak_into_prefix()
}

/// The frozen 1.3 table for `T` (testkit only: what a 1.3 plugin exported).
pub(crate) fn v1_3_table<T: FamilyPlugin>() -> history::v1_3::PluginModRef {
    history::v1_3::PluginMod {
        identity: identity::<T>,
        parse_config: parse_config::<T>,
        prompt_layout: prompt_layout::<T>,
        preprocess: preprocess::<T>,
        encoder_buckets: encoder_buckets::<T>,
        encoder_graph: encoder_graph::<T>,
        prefill_contract: prefill_contract::<T>,
        check_checkpoint: check_checkpoint::<T>,
        decoder_spec: decoder_spec::<T>,
        prefill_program: prefill_program::<T>,
        encoder_graph_for: encoder_graph_for::<T>,
    }
    .leak_into_prefix()
}

/// The frozen 1.2 table for `T` (testkit only: what a 1.2 plugin exported).
pub(crate) fn v1_2_table<T: FamilyPlugin>() -> history::v1_2::PluginModRef {
    history::v1_2::PluginMod {
        identity: identity::<T>,
        parse_config: parse_config::<T>,
        prompt_layout: prompt_layout::<T>,
        preprocess: preprocess::<T>,
        encoder_buckets: encoder_buckets::<T>,
        encoder_graph: encoder_graph::<T>,
        prefill_contract: prefill_contract::<T>,
        check_checkpoint: check_checkpoint::<T>,
        decoder_spec: decoder_spec::<T>,
        prefill_program: prefill_program::<T>,
    }
    .leak_into_prefix()
}

/// The frozen 1.1 table for `T` (testkit only: what a 1.1 plugin exported).
pub(crate) fn v1_1_table<T: FamilyPlugin>() -> history::v1_1::PluginModRef {
    history::v1_1::PluginMod {
        identity: identity::<T>,
        parse_config: parse_config::<T>,
        prompt_layout: prompt_layout::<T>,
        preprocess: preprocess::<T>,
        encoder_buckets: encoder_buckets::<T>,
        encoder_graph: encoder_graph::<T>,
        prefill_contract: prefill_contract::<T>,
        check_checkpoint: check_checkpoint::<T>,
    }
    .leak_into_prefix()
}

/// The frozen 1.0 table for `T` (testkit only: what a 1.0 plugin exported).
pub(crate) fn v1_0_table<T: FamilyPlugin>() -> history::v1_0::PluginModRef {
    history::v1_0::PluginMod {
        identity: identity::<T>,
        parse_config: parse_config::<T>,
        prompt_layout: prompt_layout::<T>,
        preprocess: preprocess::<T>,
        encoder_buckets: encoder_buckets::<T>,
        encoder_graph: encoder_graph::<T>,
        prefill_contract: prefill_contract::<T>,
    }
    .leak_into_prefix()
}

/// Exports a [`FamilyPlugin`] implementation as the plugin's ABI. Invoke once, at the crate
/// root of a `cdylib`:
///
/// ```text
/// mlxcel_plugin_api::export_plugin!(MyFamily);
/// ```
///
/// The expansion contains no `unsafe` blocks, so a plugin crate can say
/// `#![forbid(unsafe_code)]`.
///
/// Two further forms exist only for the testkit's load matrix and reproduce plugins built
/// against other plugin-api versions: `export_plugin!(T, api = v1_0)`, `(T, api = v1_1)`,
/// `(T, api = v1_2)` and `(T, api = v1_3)` export the frozen 1.0, 1.1, 1.2 and 1.3 tables, and `export_plugin!(T, declare_version = (MAJOR, MINOR))` declares an arbitrary
/// version while exporting the current table.
#[macro_export]
macro_rules! export_plugin {
    (@emit $plugin:ty, $version:expr, $header:expr) => {
        /// The plugin-api version this plugin was built against (read first by the host).
        #[unsafe(export_name = "mlxcel_plugin_api_version")]
        pub static MLXCEL_PLUGIN_API_VERSION: $crate::__export::VersionSymbol = $version;

        /// The abi_stable root module loader.
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static MLXCEL_PLUGIN_ROOT_MODULE: $crate::__export::LibHeader = $header;
    };
    ($plugin:ty) => {
        $crate::export_plugin!(@emit $plugin, $crate::__export::CURRENT_VERSION_SYMBOL, $crate::__export::lib_header::<$plugin>());
    };
    ($plugin:ty, api = v1_0) => {
        $crate::export_plugin!(
            @emit $plugin,
            $crate::__export::VersionSymbol::new($crate::ApiVersion::new(1, 0)),
            $crate::__export::lib_header_v1_0::<$plugin>()
        );
    };
    ($plugin:ty, api = v1_1) => {
        $crate::export_plugin!(
            @emit $plugin,
            $crate::__export::VersionSymbol::new($crate::ApiVersion::new(1, 1)),
            $crate::__export::lib_header_v1_1::<$plugin>()
        );
    };
    ($plugin:ty, api = v1_2) => {
        $crate::export_plugin!(
            @emit $plugin,
            $crate::__export::VersionSymbol::new($crate::ApiVersion::new(1, 2)),
            $crate::__export::lib_header_v1_2::<$plugin>()
        );
    };
    ($plugin:ty, api = v1_3) => {
        $crate::export_plugin!(
            @emit $plugin,
            $crate::__export::VersionSymbol::new($crate::ApiVersion::new(1, 3)),
            $crate::__export::lib_header_v1_3::<$plugin>()
        );
    };
    ($plugin:ty, declare_version = ($major:literal, $minor:literal)) => {
        $crate::export_plugin!(
            @emit $plugin,
            $crate::__export::VersionSymbol::new($crate::ApiVersion::new($major, $minor)),
            $crate::__export::lib_header::<$plugin>()
        );
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_turns_panics_into_errors_naming_the_entry() {
        let result: RResult<(), PluginError> = guard("preprocess", || panic!("boom"));
        let err = result.into_result().expect_err("invariant: the closure panics");
        assert_eq!(err.code, ErrorCode::Panicked);
        assert_eq!(err.message.as_str(), "plugin panicked in preprocess: boom");

        let formatted: RResult<(), PluginError> = guard("identity", || panic!("bad {}", 7));
        let err = formatted.into_result().expect_err("invariant: the closure panics");
        assert_eq!(err.message.as_str(), "plugin panicked in identity: bad 7");
    }

    #[test]
    fn guard_passes_values_and_errors_through() {
        assert_eq!(guard("x", || Ok(3)).into_result(), Ok(3));
        let err = PluginError::invalid("bad image");
        assert_eq!(guard::<()>("x", || Err(err.clone())).into_result(), Err(err));
    }
}
