//! The binary interface: the root module (an append-only table of entries), the two symbols a
//! plugin exports, and the host's raw loading steps. The only module with `unsafe`.
//!
//! A plugin exports two symbols:
//! - `mlxcel_plugin_api_version`, a plain `#[repr(C)]` [`VersionSymbol`] that the host reads
//!   before anything else (before abi_stable's header, before any call), so a refusal can name
//!   both versions even when the rest of the library is from another world;
//! - abi_stable's root-module loader, whose [`LibHeader`] carries the layout of [`PluginMod`]
//!   for abi_stable's load-time check.
//!
//! [`PluginMod`] is an abi_stable prefix type: fields up to `prefill_contract` (the 1.0 table)
//! are always present; later fields are read as `Option` and are absent in plugins built
//! against an older minor. New entries are appended at the end, never inserted.

use abi_stable::StableAbi;
use abi_stable::library::{CheckTypeLayout, LibHeader, RootModule};
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};

use crate::guest::FamilyPlugin;
use crate::types::{
    CheckpointIndex, CheckpointReport, ContractRequest, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, LayoutRequest, MediaItem, Modality, ModelConfig, PluginError, PluginIdentity, PrefillContract,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};
use crate::version::{API_VERSION, ApiVersion};

/// The name of the version symbol every plugin exports.
pub const VERSION_SYMBOL_NAME: &str = "mlxcel_plugin_api_version";

/// The name abi_stable looks up for the root module loader. `export_plugin!` spells it as a
/// literal (attributes cannot take a constant); a unit test pins it to abi_stable's own.
#[cfg_attr(not(any(feature = "host", test)), expect(dead_code, reason = "read by the host side only"))]
pub(crate) const ROOT_MODULE_SYMBOL_NAME: &str = "_1as_0lib_1header_0root_bmodule_bloader";

/// Marks a [`VersionSymbol`], so a foreign symbol of the same name is not misread.
pub(crate) const VERSION_MAGIC: [u8; 8] = *b"MLXCELPA";

/// The first thing the host reads from a plugin: which plugin-api it was built against.
///
/// Frozen forever (all majors): magic, then major, then minor.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionSymbol {
    /// Always `MLXCELPA`, so a foreign symbol of the same name is not misread.
    pub magic: [u8; 8],
    /// The plugin-api major version.
    pub major: u32,
    /// The plugin-api minor version.
    pub minor: u32,
}

impl VersionSymbol {
    /// The symbol for a plugin built against `version`.
    pub const fn new(version: ApiVersion) -> Self {
        Self { magic: VERSION_MAGIC, major: version.major, minor: version.minor }
    }

    /// The version, if the magic is right.
    pub fn version(&self) -> Option<ApiVersion> {
        (self.magic == VERSION_MAGIC).then_some(ApiVersion::new(self.major, self.minor))
    }
}

pub(crate) use table::{PluginMod, PluginModRef};

/// The current root module; a module of its own so the accessors that only the host reads
/// do not warn in plugin builds.
mod table {
    #![cfg_attr(not(feature = "host"), expect(dead_code, reason = "accessors are read by the host side only"))]

    use super::*;

    /// The root module: one entry per stage. Owned by the plugin, `'static`, never freed.
    ///
    /// Every entry returns owned values (abi_stable containers free themselves through the
    /// allocator that made them, so the host may drop them) and borrows its arguments for the
    /// duration of the call only. No entry calls back into the host.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = PluginModRef, prefix_fields = PluginMod_Prefix)))]
    #[sabi(missing_field(option))]
    pub(crate) struct PluginMod {
        /// Who the plugin is (1.0).
        pub(crate) identity: extern "C" fn() -> RResult<PluginIdentity, PluginError>,
        /// `config.json` and processor config text to the family's typed view (1.0).
        pub(crate) parse_config: extern "C" fn(RStr<'_>, RStr<'_>) -> RResult<ModelConfig, PluginError>,
        /// Placeholder expansion (1.0).
        pub(crate) prompt_layout: extern "C" fn(&ModelConfig, &LayoutRequest) -> RResult<PromptLayout, PluginError>,
        /// Image or audio bytes to tensors and grid metadata (1.0).
        pub(crate) preprocess:
            extern "C" fn(&ModelConfig, &MediaItem, &PreprocessOptions) -> RResult<Preprocessed, PluginError>,
        /// The static shapes the encoder can be compiled for (1.0).
        pub(crate) encoder_buckets: extern "C" fn(&ModelConfig, Modality) -> RResult<RVec<ShapeBucket>, PluginError>,
        /// The encoder as StableHLO for one bucket (1.0).
        pub(crate) encoder_graph:
            extern "C" fn(&ModelConfig, &EncoderGraphRequest) -> RResult<EncoderGraph, PluginError>,
        /// The prepared-prefill contract (1.0).
        #[sabi(last_prefix_field)]
        pub(crate) prefill_contract:
            extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillContract, PluginError>,
        /// Checks a checkpoint's tensor index before any compile (1.1).
        pub(crate) check_checkpoint:
            extern "C" fn(&ModelConfig, &CheckpointIndex) -> RResult<CheckpointReport, PluginError>,
        /// The family's own text decoder spec, as `mlxcel_decoder::DecoderSpec` JSON in its
        /// `SPEC_SCHEMA`; none has the host read a preset (1.2).
        pub(crate) decoder_spec: extern "C" fn(&ModelConfig) -> RResult<ROption<RString>, PluginError>,
        /// The prepared-prefill contract as a program: placements that replace or add rows at
        /// any tokens, per-item injections (1.2).
        pub(crate) prefill_program:
            extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillProgram, PluginError>,
        /// The encoder as StableHLO for one bucket, laid out for the target CPU (1.3).
        pub(crate) encoder_graph_for:
            extern "C" fn(&ModelConfig, &EncoderGraphRequest, &EncoderTarget) -> RResult<EncoderGraph, PluginError>,
        /// The encoder as StableHLO for one bucket, laid out for the target CPU and computing
        /// in the compute asked for (1.4).
        pub(crate) encoder_graph_compute: extern "C" fn(
            &ModelConfig,
            &EncoderGraphRequest,
            &EncoderTarget,
            EncoderCompute,
        ) -> RResult<EncoderGraph, PluginError>,
    }

    impl RootModule for PluginModRef {
        abi_stable::declare_root_module_statics! {PluginModRef}
        const BASE_NAME: &'static str = "mlxcel_family";
        const NAME: &'static str = "mlxcel family plugin";
        const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.4.0");
    }
}

/// Frozen root-module tables of older minors, kept so the load matrix can be tested: a plugin
/// exporting one of these is byte-for-byte what an older plugin-api would have produced.
pub(crate) mod history {
    /// The 1.3 table.
    pub(crate) mod v1_3 {
        #![cfg_attr(not(feature = "host"), expect(dead_code, reason = "accessors are read by the host side only"))]

        use abi_stable::StableAbi;
        use abi_stable::library::RootModule;
        use abi_stable::sabi_types::VersionStrings;
        use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};

        use crate::types::{
            CheckpointIndex, CheckpointReport, ContractRequest, EncoderGraph, EncoderGraphRequest, EncoderTarget,
            LayoutRequest, MediaItem, Modality, ModelConfig, PluginError, PluginIdentity, PrefillContract,
            PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
        };

        /// The 1.3 root module; the same name as the current one, as the layout check requires.
        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModRef, prefix_fields = PluginMod_Prefix)))]
        #[sabi(missing_field(option))]
        pub(crate) struct PluginMod {
            pub(crate) identity: extern "C" fn() -> RResult<PluginIdentity, PluginError>,
            pub(crate) parse_config: extern "C" fn(RStr<'_>, RStr<'_>) -> RResult<ModelConfig, PluginError>,
            pub(crate) prompt_layout: extern "C" fn(&ModelConfig, &LayoutRequest) -> RResult<PromptLayout, PluginError>,
            pub(crate) preprocess:
                extern "C" fn(&ModelConfig, &MediaItem, &PreprocessOptions) -> RResult<Preprocessed, PluginError>,
            pub(crate) encoder_buckets:
                extern "C" fn(&ModelConfig, Modality) -> RResult<RVec<ShapeBucket>, PluginError>,
            pub(crate) encoder_graph:
                extern "C" fn(&ModelConfig, &EncoderGraphRequest) -> RResult<EncoderGraph, PluginError>,
            #[sabi(last_prefix_field)]
            pub(crate) prefill_contract:
                extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillContract, PluginError>,
            pub(crate) check_checkpoint:
                extern "C" fn(&ModelConfig, &CheckpointIndex) -> RResult<CheckpointReport, PluginError>,
            pub(crate) decoder_spec: extern "C" fn(&ModelConfig) -> RResult<ROption<RString>, PluginError>,
            pub(crate) prefill_program:
                extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillProgram, PluginError>,
            pub(crate) encoder_graph_for:
                extern "C" fn(&ModelConfig, &EncoderGraphRequest, &EncoderTarget) -> RResult<EncoderGraph, PluginError>,
        }

        impl RootModule for PluginModRef {
            abi_stable::declare_root_module_statics! {PluginModRef}
            const BASE_NAME: &'static str = "mlxcel_family";
            const NAME: &'static str = "mlxcel family plugin";
            const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.3.0");
        }
    }

    /// The 1.2 table.
    pub(crate) mod v1_2 {
        #![cfg_attr(not(feature = "host"), expect(dead_code, reason = "accessors are read by the host side only"))]

        use abi_stable::StableAbi;
        use abi_stable::library::RootModule;
        use abi_stable::sabi_types::VersionStrings;
        use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};

        use crate::types::{
            CheckpointIndex, CheckpointReport, ContractRequest, EncoderGraph, EncoderGraphRequest, LayoutRequest,
            MediaItem, Modality, ModelConfig, PluginError, PluginIdentity, PrefillContract, PrefillProgram,
            PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
        };

        /// The 1.2 root module; the same name as the current one, as the layout check requires.
        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModRef, prefix_fields = PluginMod_Prefix)))]
        #[sabi(missing_field(option))]
        pub(crate) struct PluginMod {
            pub(crate) identity: extern "C" fn() -> RResult<PluginIdentity, PluginError>,
            pub(crate) parse_config: extern "C" fn(RStr<'_>, RStr<'_>) -> RResult<ModelConfig, PluginError>,
            pub(crate) prompt_layout: extern "C" fn(&ModelConfig, &LayoutRequest) -> RResult<PromptLayout, PluginError>,
            pub(crate) preprocess:
                extern "C" fn(&ModelConfig, &MediaItem, &PreprocessOptions) -> RResult<Preprocessed, PluginError>,
            pub(crate) encoder_buckets:
                extern "C" fn(&ModelConfig, Modality) -> RResult<RVec<ShapeBucket>, PluginError>,
            pub(crate) encoder_graph:
                extern "C" fn(&ModelConfig, &EncoderGraphRequest) -> RResult<EncoderGraph, PluginError>,
            #[sabi(last_prefix_field)]
            pub(crate) prefill_contract:
                extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillContract, PluginError>,
            pub(crate) check_checkpoint:
                extern "C" fn(&ModelConfig, &CheckpointIndex) -> RResult<CheckpointReport, PluginError>,
            pub(crate) decoder_spec: extern "C" fn(&ModelConfig) -> RResult<ROption<RString>, PluginError>,
            pub(crate) prefill_program:
                extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillProgram, PluginError>,
        }

        impl RootModule for PluginModRef {
            abi_stable::declare_root_module_statics! {PluginModRef}
            const BASE_NAME: &'static str = "mlxcel_family";
            const NAME: &'static str = "mlxcel family plugin";
            const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.2.0");
        }
    }

    /// The 1.1 table.
    pub(crate) mod v1_1 {
        #![cfg_attr(not(feature = "host"), expect(dead_code, reason = "accessors are read by the host side only"))]

        use abi_stable::StableAbi;
        use abi_stable::library::RootModule;
        use abi_stable::sabi_types::VersionStrings;
        use abi_stable::std_types::{RResult, RStr, RVec};

        use crate::types::{
            CheckpointIndex, CheckpointReport, ContractRequest, EncoderGraph, EncoderGraphRequest, LayoutRequest,
            MediaItem, Modality, ModelConfig, PluginError, PluginIdentity, PrefillContract, PreprocessOptions,
            Preprocessed, PromptLayout, ShapeBucket,
        };

        /// The 1.1 root module; the same name as the current one, as the layout check requires.
        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModRef, prefix_fields = PluginMod_Prefix)))]
        #[sabi(missing_field(option))]
        pub(crate) struct PluginMod {
            pub(crate) identity: extern "C" fn() -> RResult<PluginIdentity, PluginError>,
            pub(crate) parse_config: extern "C" fn(RStr<'_>, RStr<'_>) -> RResult<ModelConfig, PluginError>,
            pub(crate) prompt_layout: extern "C" fn(&ModelConfig, &LayoutRequest) -> RResult<PromptLayout, PluginError>,
            pub(crate) preprocess:
                extern "C" fn(&ModelConfig, &MediaItem, &PreprocessOptions) -> RResult<Preprocessed, PluginError>,
            pub(crate) encoder_buckets:
                extern "C" fn(&ModelConfig, Modality) -> RResult<RVec<ShapeBucket>, PluginError>,
            pub(crate) encoder_graph:
                extern "C" fn(&ModelConfig, &EncoderGraphRequest) -> RResult<EncoderGraph, PluginError>,
            #[sabi(last_prefix_field)]
            pub(crate) prefill_contract:
                extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillContract, PluginError>,
            pub(crate) check_checkpoint:
                extern "C" fn(&ModelConfig, &CheckpointIndex) -> RResult<CheckpointReport, PluginError>,
        }

        impl RootModule for PluginModRef {
            abi_stable::declare_root_module_statics! {PluginModRef}
            const BASE_NAME: &'static str = "mlxcel_family";
            const NAME: &'static str = "mlxcel family plugin";
            const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.1.0");
        }
    }

    /// The 1.0 table.
    pub(crate) mod v1_0 {
        #![cfg_attr(not(feature = "host"), expect(dead_code, reason = "accessors are read by the host side only"))]

        use abi_stable::StableAbi;
        use abi_stable::library::RootModule;
        use abi_stable::sabi_types::VersionStrings;
        use abi_stable::std_types::{RResult, RStr, RVec};

        use crate::types::{
            ContractRequest, EncoderGraph, EncoderGraphRequest, LayoutRequest, MediaItem, Modality, ModelConfig,
            PluginError, PluginIdentity, PrefillContract, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
        };

        /// The 1.0 root module; the same name as the current one, as the layout check requires.
        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModRef, prefix_fields = PluginMod_Prefix)))]
        #[sabi(missing_field(option))]
        pub(crate) struct PluginMod {
            pub(crate) identity: extern "C" fn() -> RResult<PluginIdentity, PluginError>,
            pub(crate) parse_config: extern "C" fn(RStr<'_>, RStr<'_>) -> RResult<ModelConfig, PluginError>,
            pub(crate) prompt_layout: extern "C" fn(&ModelConfig, &LayoutRequest) -> RResult<PromptLayout, PluginError>,
            pub(crate) preprocess:
                extern "C" fn(&ModelConfig, &MediaItem, &PreprocessOptions) -> RResult<Preprocessed, PluginError>,
            pub(crate) encoder_buckets:
                extern "C" fn(&ModelConfig, Modality) -> RResult<RVec<ShapeBucket>, PluginError>,
            pub(crate) encoder_graph:
                extern "C" fn(&ModelConfig, &EncoderGraphRequest) -> RResult<EncoderGraph, PluginError>,
            #[sabi(last_prefix_field)]
            pub(crate) prefill_contract:
                extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillContract, PluginError>,
        }

        impl RootModule for PluginModRef {
            abi_stable::declare_root_module_statics! {PluginModRef}
            const BASE_NAME: &'static str = "mlxcel_family";
            const NAME: &'static str = "mlxcel family plugin";
            const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.0.0");
        }
    }
}

extern "C" fn construct_current<T: FamilyPlugin>() -> abi_stable::library::RootModuleResult {
    abi_stable::library::__call_root_module_loader(crate::guest::current_table::<T>)
}

extern "C" fn construct_v1_0<T: FamilyPlugin>() -> abi_stable::library::RootModuleResult {
    abi_stable::library::__call_root_module_loader(crate::guest::v1_0_table::<T>)
}

extern "C" fn construct_v1_1<T: FamilyPlugin>() -> abi_stable::library::RootModuleResult {
    abi_stable::library::__call_root_module_loader(crate::guest::v1_1_table::<T>)
}

extern "C" fn construct_v1_2<T: FamilyPlugin>() -> abi_stable::library::RootModuleResult {
    abi_stable::library::__call_root_module_loader(crate::guest::v1_2_table::<T>)
}

extern "C" fn construct_v1_3<T: FamilyPlugin>() -> abi_stable::library::RootModuleResult {
    abi_stable::library::__call_root_module_loader(crate::guest::v1_3_table::<T>)
}

/// The abi_stable header for plugin `T` at the current minor. Used by `export_plugin!`.
pub const fn lib_header<T: FamilyPlugin>() -> LibHeader {
    // SAFETY: `from_constructor::<M>` requires that the constructor returns a module of type
    // `M` erased; `construct_current::<T>` returns exactly a `PluginModRef` built by
    // `guest::current_table`, and `M` is `PluginModRef`.
    unsafe { LibHeader::from_constructor::<PluginModRef>(construct_current::<T>, CheckTypeLayout::Yes) }
}

/// The abi_stable header for plugin `T` exporting the frozen 1.0 table (testkit only).
pub const fn lib_header_v1_0<T: FamilyPlugin>() -> LibHeader {
    // SAFETY: as in `lib_header`: `construct_v1_0::<T>` returns a `history::v1_0::PluginModRef`
    // and that is the `M` given here.
    unsafe { LibHeader::from_constructor::<history::v1_0::PluginModRef>(construct_v1_0::<T>, CheckTypeLayout::Yes) }
}

/// The abi_stable header for plugin `T` exporting the frozen 1.1 table (testkit only).
pub const fn lib_header_v1_1<T: FamilyPlugin>() -> LibHeader {
    // SAFETY: as in `lib_header`: `construct_v1_1::<T>` returns a `history::v1_1::PluginModRef`
    // and that is the `M` given here.
    unsafe { LibHeader::from_constructor::<history::v1_1::PluginModRef>(construct_v1_1::<T>, CheckTypeLayout::Yes) }
}

/// The abi_stable header for plugin `T` exporting the frozen 1.2 table (testkit only).
pub const fn lib_header_v1_2<T: FamilyPlugin>() -> LibHeader {
    // SAFETY: as in `lib_header`: `construct_v1_2::<T>` returns a `history::v1_2::PluginModRef`
    // and that is the `M` given here.
    unsafe { LibHeader::from_constructor::<history::v1_2::PluginModRef>(construct_v1_2::<T>, CheckTypeLayout::Yes) }
}

/// The abi_stable header for plugin `T` exporting the frozen 1.3 table (testkit only).
pub const fn lib_header_v1_3<T: FamilyPlugin>() -> LibHeader {
    // SAFETY: as in `lib_header`: `construct_v1_3::<T>` returns a `history::v1_3::PluginModRef`
    // and that is the `M` given here.
    unsafe { LibHeader::from_constructor::<history::v1_3::PluginModRef>(construct_v1_3::<T>, CheckTypeLayout::Yes) }
}

/// The version symbol at the current version.
pub const CURRENT_VERSION_SYMBOL: VersionSymbol = VersionSymbol::new(API_VERSION);

#[cfg(feature = "host")]
pub(crate) use host::{OpenedLibrary, RawLoadError, Table, open_library};

#[cfg(feature = "host")]
mod host {
    use std::path::Path;

    use abi_stable::library::{LibraryError, RootModule};
    use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};

    use super::{PluginModRef, ROOT_MODULE_SYMBOL_NAME, VERSION_SYMBOL_NAME, VersionSymbol, history};
    use crate::types::{
        CheckpointIndex, CheckpointReport, ContractRequest, EncoderCompute, EncoderGraph, EncoderGraphRequest,
        EncoderTarget, LayoutRequest, MediaItem, Modality, ModelConfig, PluginError, PluginIdentity, PrefillContract,
        PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
    };
    use crate::version::{API_VERSION, ApiVersion};

    /// What can go wrong before the first call into a plugin.
    #[derive(Debug)]
    pub(crate) enum RawLoadError {
        /// dlopen failed: not a shared library, wrong architecture, unresolved dependency.
        Open(String),
        /// A required symbol is missing.
        MissingSymbol(&'static str),
        /// The version symbol exists but does not carry the magic.
        BadVersionSymbol,
        /// The version the library declares is one this host does not load.
        Incompatible(ApiVersion),
        /// The abi_stable header declares a version that differs from the version symbol.
        HeaderDisagrees { symbol: ApiVersion, header: String },
        /// abi_stable refused the library (layout check, its own version, constructor panic).
        AbiStable(String),
    }

    /// A library that passed every check and whose root module is initialized.
    pub(crate) struct OpenedLibrary {
        pub(crate) declared: ApiVersion,
        pub(crate) table: Table,
    }

    /// The root module of a loaded plugin, typed by the minor it was built against.
    ///
    /// abi_stable's layout check accepts a library whose prefix type has *more* fields than the
    /// host expects (an older host), but refuses one with fewer (an older plugin). So the host
    /// keeps the frozen table of every supported older minor and checks each library against
    /// the table of the minor it declares; entries common to all minors are read from either.
    pub(crate) enum Table {
        /// A plugin built against 1.0.
        V1_0(history::v1_0::PluginModRef),
        /// A plugin built against 1.1.
        V1_1(history::v1_1::PluginModRef),
        /// A plugin built against 1.2.
        V1_2(history::v1_2::PluginModRef),
        /// A plugin built against 1.3.
        V1_3(history::v1_3::PluginModRef),
        /// A plugin built against the current minor.
        Current(PluginModRef),
    }

    /// Reads an entry that exists in every supported minor.
    macro_rules! common_entry {
        ($name:ident: $ty:ty) => {
            pub(crate) fn $name(&self) -> $ty {
                match self {
                    Table::V1_0(m) => m.$name(),
                    Table::V1_1(m) => m.$name(),
                    Table::V1_2(m) => m.$name(),
                    Table::V1_3(m) => m.$name(),
                    Table::Current(m) => m.$name(),
                }
            }
        };
    }

    impl Table {
        common_entry!(identity: extern "C" fn() -> RResult<PluginIdentity, PluginError>);
        common_entry!(parse_config: extern "C" fn(RStr<'_>, RStr<'_>) -> RResult<ModelConfig, PluginError>);
        common_entry!(prompt_layout: extern "C" fn(&ModelConfig, &LayoutRequest) -> RResult<PromptLayout, PluginError>);
        common_entry!(preprocess: extern "C" fn(&ModelConfig, &MediaItem, &PreprocessOptions) -> RResult<Preprocessed, PluginError>);
        common_entry!(encoder_buckets: extern "C" fn(&ModelConfig, Modality) -> RResult<RVec<ShapeBucket>, PluginError>);
        common_entry!(encoder_graph: extern "C" fn(&ModelConfig, &EncoderGraphRequest) -> RResult<EncoderGraph, PluginError>);
        common_entry!(prefill_contract: extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillContract, PluginError>);

        /// `check_checkpoint`, absent before 1.1.
        pub(crate) fn check_checkpoint(
            &self,
        ) -> Option<extern "C" fn(&ModelConfig, &CheckpointIndex) -> RResult<CheckpointReport, PluginError>> {
            match self {
                Table::V1_0(_) => None,
                Table::V1_1(m) => m.check_checkpoint(),
                Table::V1_2(m) => m.check_checkpoint(),
                Table::V1_3(m) => m.check_checkpoint(),
                Table::Current(m) => m.check_checkpoint(),
            }
        }

        /// `prefill_program`, absent before 1.2.
        pub(crate) fn prefill_program(
            &self,
        ) -> Option<extern "C" fn(&ModelConfig, &ContractRequest) -> RResult<PrefillProgram, PluginError>> {
            match self {
                Table::V1_0(_) | Table::V1_1(_) => None,
                Table::V1_2(m) => m.prefill_program(),
                Table::V1_3(m) => m.prefill_program(),
                Table::Current(m) => m.prefill_program(),
            }
        }

        /// `decoder_spec`, absent before 1.2.
        pub(crate) fn decoder_spec(
            &self,
        ) -> Option<extern "C" fn(&ModelConfig) -> RResult<ROption<RString>, PluginError>> {
            match self {
                Table::V1_0(_) | Table::V1_1(_) => None,
                Table::V1_2(m) => m.decoder_spec(),
                Table::V1_3(m) => m.decoder_spec(),
                Table::Current(m) => m.decoder_spec(),
            }
        }

        /// `encoder_graph_for`, absent before 1.3.
        pub(crate) fn encoder_graph_for(
            &self,
        ) -> Option<
            extern "C" fn(&ModelConfig, &EncoderGraphRequest, &EncoderTarget) -> RResult<EncoderGraph, PluginError>,
        > {
            match self {
                Table::V1_0(_) | Table::V1_1(_) | Table::V1_2(_) => None,
                Table::V1_3(m) => m.encoder_graph_for(),
                Table::Current(m) => m.encoder_graph_for(),
            }
        }

        /// `encoder_graph_compute`, absent before 1.4.
        #[allow(clippy::type_complexity, reason = "the entry's signature, spelled as the table spells it")]
        pub(crate) fn encoder_graph_compute(
            &self,
        ) -> Option<
            extern "C" fn(
                &ModelConfig,
                &EncoderGraphRequest,
                &EncoderTarget,
                EncoderCompute,
            ) -> RResult<EncoderGraph, PluginError>,
        > {
            match self {
                Table::V1_0(_) | Table::V1_1(_) | Table::V1_2(_) | Table::V1_3(_) => None,
                Table::Current(m) => m.encoder_graph_compute(),
            }
        }
    }

    /// Opens `path`, checks the version symbol against `accept` before anything else, then
    /// lets abi_stable check the layout and build the root module. Never unloads: abi_stable
    /// keeps every library it opened for the life of the process.
    pub(crate) fn open_library(
        path: &Path,
        accept: impl FnOnce(ApiVersion) -> bool,
    ) -> Result<OpenedLibrary, RawLoadError> {
        // SAFETY: opening a shared library runs its ELF initializers, which we cannot check.
        // The loader only reaches here for a file named by a validated manifest whose sha256
        // matched, i.e. a library the user installed as a plugin; Rust cdylibs built with
        // `export_plugin!` have no initializers of their own.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| RawLoadError::Open(e.to_string()))?;
        let symbol_name = format!("{VERSION_SYMBOL_NAME}\0");
        // SAFETY: the symbol is looked up as a data address, not called. Its type is only
        // trusted below after the magic matches.
        let symbol = unsafe { library.get::<*const VersionSymbol>(symbol_name.as_bytes()) }
            .map_err(|_| RawLoadError::MissingSymbol(VERSION_SYMBOL_NAME))?;
        let address: *const VersionSymbol = *symbol;
        if address.is_null() {
            return Err(RawLoadError::MissingSymbol(VERSION_SYMBOL_NAME));
        }
        // SAFETY: `mlxcel_plugin_api_version` is reserved for a `#[repr(C)] VersionSymbol`
        // static emitted by `export_plugin!`; the struct is frozen across all majors, the
        // address is non-null and stays mapped while `library` is alive (all of this block).
        // A read copies 16 bytes of initialized static data.
        let declared = unsafe { address.read() };
        let declared = declared.version().ok_or(RawLoadError::BadVersionSymbol)?;
        if !accept(declared) {
            return Err(RawLoadError::Incompatible(declared));
        }
        let root_name = format!("{ROOT_MODULE_SYMBOL_NAME}\0");
        // SAFETY: only checks that the symbol exists; the pointer is not used.
        if unsafe { library.get::<*const u8>(root_name.as_bytes()) }.is_err() {
            return Err(RawLoadError::MissingSymbol(ROOT_MODULE_SYMBOL_NAME));
        }
        let header = abi_stable::library::lib_header_from_path(path).map_err(abi_error)?;
        let header_version = header.version_strings().version.as_str().to_owned();
        let matches = header_version.parse::<ApiVersion>().map(|v| v == declared).unwrap_or(false);
        if !matches {
            return Err(RawLoadError::HeaderDisagrees { symbol: declared, header: header_version });
        }
        let table = if declared == API_VERSION {
            Table::Current(header.init_root_module::<PluginModRef>().map_err(abi_error)?)
        } else if declared == ApiVersion::new(1, 3) {
            Table::V1_3(header.init_root_module::<history::v1_3::PluginModRef>().map_err(abi_error)?)
        } else if declared == ApiVersion::new(1, 2) {
            Table::V1_2(header.init_root_module::<history::v1_2::PluginModRef>().map_err(abi_error)?)
        } else if declared == ApiVersion::new(1, 1) {
            Table::V1_1(header.init_root_module::<history::v1_1::PluginModRef>().map_err(abi_error)?)
        } else if declared == ApiVersion::new(1, 0) {
            Table::V1_0(header.init_root_module::<history::v1_0::PluginModRef>().map_err(abi_error)?)
        } else {
            return Err(RawLoadError::AbiStable(format!(
                "this host keeps no root-module table for plugin-api {declared}"
            )));
        };
        // abi_stable holds its own handle forever; ours can go.
        drop(library);
        Ok(OpenedLibrary { declared, table })
    }

    fn abi_error(error: LibraryError) -> RawLoadError {
        RawLoadError::AbiStable(error.to_string())
    }

    // The root module type must stay loadable through abi_stable's API.
    const _: fn() = || {
        let _ = <PluginModRef as RootModule>::NAME;
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_module_symbol_is_abi_stables() {
        assert_eq!(ROOT_MODULE_SYMBOL_NAME, abi_stable::library::ROOT_MODULE_LOADER_NAME);
    }

    #[test]
    fn root_module_version_strings_match_api_version() {
        let declared: ApiVersion = <PluginModRef as RootModule>::VERSION_STRINGS
            .version
            .as_str()
            .parse()
            .expect("invariant: version strings parse");
        assert_eq!(declared, API_VERSION);
    }

    #[test]
    fn version_symbol_layout_is_frozen() {
        assert_eq!(std::mem::size_of::<VersionSymbol>(), 16);
        assert_eq!(std::mem::offset_of!(VersionSymbol, major), 8);
        assert_eq!(std::mem::offset_of!(VersionSymbol, minor), 12);
    }
}
