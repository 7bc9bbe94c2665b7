//! The stable interface between `mlxcel-host` and model-family plugins.
//!
//! A family plugin is a `cdylib` that implements [`FamilyPlugin`] (plain, safe Rust) and calls
//! [`export_plugin!`] once. The host finds plugins through their manifests ([`Manifest`]),
//! loads them with [`scan`] or [`load_plugin`], and calls them through [`LoadedPlugin`]. The
//! interface is data in, data out: no entry calls back into the host, so every answer can be
//! inspected, hashed and compared with a golden. A family whose language model is not one of
//! the decoder library's presets declares its own ([`FamilyPlugin::decoder_spec`], since 1.2).
//!
//! **API Boundary:** every public type here is part of the plugin ABI or the manifest schema.
//! Changing one is an "API expansion" change; see `version` for the rules.
//!
//! **Architecture Invariant:** `unsafe` lives only in the `abi` module. Plugins contain none:
//! `export_plugin!` expands to two `static`s with export names and no `unsafe` block.

#![deny(unsafe_code)]
#![deny(missing_docs)]

#[expect(unsafe_code, reason = "the ABI module is the one place that loads libraries and builds abi_stable headers")]
mod abi;
pub mod conformance;
mod error;
mod guest;
#[cfg(feature = "host")]
mod loader;
pub mod manifest;
pub mod types;
mod version;

pub use abi_stable::std_types::{ROption, RString, RVec};
/// The text decoder library: a family that brings its own decoder builds its
/// [`decoder::DecoderSpec`] from these blocks ([`FamilyPlugin::decoder_spec`]).
pub use mlxcel_decoder as decoder;

pub use crate::abi::{VERSION_SYMBOL_NAME, VersionSymbol};
pub use crate::error::{ALLOW_UNQUALIFIED_FLAG, Error, Result};
pub use crate::guest::{FamilyPlugin, ParsedConfig};
#[cfg(feature = "host")]
pub use crate::loader::{
    DirPolicy, LoadedPlugin, PluginSet, QualificationPolicy, Rejection, check_capability, load_plugin, scan, scan_with,
};
pub use crate::manifest::{Manifest, Status};
pub use crate::types::*;
pub use crate::version::{API_VERSION, ApiVersion, ParseApiVersionError, SUPPORTED_VERSIONS};

/// Items `export_plugin!` expands to; not part of the API.
#[doc(hidden)]
pub mod __export {
    pub use crate::abi::{
        CURRENT_VERSION_SYMBOL, VersionSymbol, lib_header, lib_header_v1_0, lib_header_v1_1, lib_header_v1_2,
        lib_header_v1_3,
    };
    pub use abi_stable::library::LibHeader;
}
