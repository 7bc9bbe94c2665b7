//! The crate's one error type, for the host side: manifests, loading, calls and the gate.

use std::path::PathBuf;

use crate::manifest::Status;
use crate::types::{Capability, PluginError};
use crate::version::ApiVersion;

/// The flag that lets the host serve capabilities that are not `qualified`.
pub const ALLOW_UNQUALIFIED_FLAG: &str = "--allow-unqualified";

/// Everything that can go wrong on the host side of the plugin boundary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// A manifest failed to parse or validate; the library was not opened.
    #[error("invalid manifest {}: {problem}", path.display())]
    InvalidManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong, lowercase.
        problem: String,
    },

    /// A plugin directory, manifest or library others could change or that leads out of the
    /// directory, refused unless the host was told to allow it.
    #[error("{} {reason}; refused (a plugin runs inside the host: make it writable by its owner only and keep it inside the plugin directory, or pass --allow-unsafe-plugin-dir)", path.display())]
    UnsafePath {
        /// The directory or file.
        path: PathBuf,
        /// What is unsafe about it, lowercase.
        reason: String,
    },

    /// A shared library in the plugin directory that no manifest names.
    #[error("no manifest names library {}", path.display())]
    NoManifest {
        /// The library file.
        path: PathBuf,
    },

    /// The plugin was built against a plugin-api this host cannot load.
    #[error(
        "plugin `{plugin}` was built against plugin-api {plugin_version}, which this host \
         (plugin-api {host_version}) cannot load: {hint}"
    )]
    IncompatibleApi {
        /// The plugin name (from its manifest).
        plugin: String,
        /// What the plugin was built against.
        plugin_version: ApiVersion,
        /// What this host implements.
        host_version: ApiVersion,
        /// How to resolve it.
        hint: &'static str,
    },

    /// The library's bytes do not hash to the manifest's sha256.
    #[error(
        "library {} does not match its manifest: sha256 is {actual}, manifest says {expected}",
        path.display()
    )]
    ShaMismatch {
        /// The library file.
        path: PathBuf,
        /// From the manifest.
        expected: String,
        /// Of the file.
        actual: String,
    },

    /// dlopen failed: not a shared library, truncated, wrong architecture.
    #[error("cannot open library {}: {reason}", path.display())]
    LibraryOpen {
        /// The library file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },

    /// The library lacks a symbol every plugin exports.
    #[error("library {} lacks the symbol `{symbol}`: not built with export_plugin!", path.display())]
    MissingSymbol {
        /// The library file.
        path: PathBuf,
        /// The missing symbol.
        symbol: &'static str,
    },

    /// abi_stable's load-time check refused the root module, or the two version records in
    /// the library disagree.
    #[error("library {} failed the abi check: {reason}", path.display())]
    AbiCheck {
        /// The library file.
        path: PathBuf,
        /// abi_stable's report.
        reason: String,
    },

    /// The library and its manifest disagree.
    #[error(
        "plugin `{plugin}` disagrees with its manifest on {field}: manifest says {manifest}, \
         library says {library}"
    )]
    ManifestMismatch {
        /// The plugin name (from its manifest).
        plugin: String,
        /// Which field.
        field: &'static str,
        /// The manifest's value.
        manifest: String,
        /// The library's value.
        library: String,
    },

    /// Two plugins claim the same architecture, model type or name; both are skipped.
    #[error("plugin `{plugin}` claims {kind} `{value}`, also claimed by `{others}`; both are skipped")]
    DuplicateClaim {
        /// The plugin being skipped.
        plugin: String,
        /// `architecture`, `model_type` or `name`.
        kind: &'static str,
        /// The contested value.
        value: String,
        /// The other claimants, comma-separated.
        others: String,
    },

    /// A plugin entry returned an error (or panicked: `error.code` is `Panicked`).
    #[error("plugin `{plugin}` failed in {entry}: {error}")]
    Plugin {
        /// The plugin name.
        plugin: String,
        /// The entry point.
        entry: &'static str,
        /// The plugin's error.
        error: PluginError,
    },

    /// A plugin entry answered with something the host cannot use: a tensor whose bytes do not
    /// fill its shape, a value that is not finite, a grid with no rows. The plugin's fault, never
    /// the input's.
    #[error("plugin `{plugin}` answered {entry} with a malformed result: {problem}")]
    Malformed {
        /// The plugin name.
        plugin: String,
        /// The entry point.
        entry: &'static str,
        /// What is wrong, lowercase.
        problem: String,
    },

    /// No loaded plugin accepts a checkpoint.
    #[error("no loaded plugin accepts architecture `{architecture}` (model_type `{model_type}`)")]
    NoPlugin {
        /// The config's first `architectures` entry.
        architecture: String,
        /// The config's `model_type`.
        model_type: String,
    },

    /// A checkpoint config could not be read for plugin selection.
    #[error("cannot read checkpoint config: {reason}")]
    BadConfig {
        /// What is wrong.
        reason: String,
    },

    /// The capability is declared but not qualified, and the host was not started with the
    /// opt-in flag.
    #[error(
        "capability `{}` of plugin `{plugin}` is {status}, not qualified; start the host with \
         {flag} to serve it anyway",
        capability.as_str(),
        flag = ALLOW_UNQUALIFIED_FLAG
    )]
    Unqualified {
        /// The plugin name.
        plugin: String,
        /// The capability.
        capability: Capability,
        /// Its manifest status.
        status: Status,
    },

    /// Media from a checkpoint of a form the plugin has not qualified (`experimental` without
    /// the opt-in flag; `unsupported` or not declared: never).
    #[error(
        "plugin `{plugin}` {}",
        match status {
            Some(Status::Experimental) => format!(
                "serves checkpoints in the `{form}` form as experimental, not qualified; start the host with {} to \
                 serve them anyway",
                ALLOW_UNQUALIFIED_FLAG
            ),
            _ => format!("does not serve media from checkpoints in the `{form}` form (its manifest does not qualify it)"),
        }
    )]
    Form {
        /// The plugin name.
        plugin: String,
        /// The checkpoint form (of `manifest::FORMS`).
        form: String,
        /// Its manifest status, `None` when not declared.
        status: Option<Status>,
    },

    /// The plugin does not support the capability at all (`unsupported` or not declared);
    /// no flag changes that.
    #[error("capability `{}` is not supported by plugin `{plugin}`", capability.as_str())]
    Unsupported {
        /// The plugin name.
        plugin: String,
        /// The capability.
        capability: Capability,
    },
}

impl Error {
    /// Checkpoints of `form` are `status` (or, `None`, not declared) in `plugin`'s manifest.
    pub fn form(plugin: &str, form: &str, status: Option<Status>) -> Error {
        Error::Form { plugin: plugin.to_owned(), form: form.to_owned(), status }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
