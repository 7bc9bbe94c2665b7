//! The host side: scanning a plugin directory, loading each plugin through every check, calling
//! its entries, and gating capabilities by qualification status.
//!
//! A directory others can write to is refused before anything in it is read, unless
//! [`DirPolicy::allow_unsafe`] says otherwise.
//!
//! Loading one plugin, in order (a failure at any step skips the plugin with its reason):
//! 0. the manifest and the library are inside the directory (no symlink leads out) and
//!    writable by their owner only, unless [`DirPolicy::allow_unsafe`];
//! 1. parse and validate the manifest (no library access yet);
//! 2. check the manifest's plugin-api version against this host;
//! 3. hash the library and compare with the manifest's sha256;
//! 4. open the library and read its version symbol, before any other symbol or call;
//! 5. let abi_stable check the root module's layout and build it;
//! 6. call `identity` (the first call into the plugin) and compare it with the manifest.
//!
//! **Architecture Invariant:** a bad plugin never stops the host. Every failure becomes a
//! [`Rejection`] and the rest of the directory loads.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use abi_stable::std_types::{RResult, RStr};
use sha2::{Digest, Sha256};

use crate::abi::{OpenedLibrary, RawLoadError, Table, open_library};
use crate::error::{Error, Result};
use crate::manifest::{Manifest, Status};
use crate::types::{
    Capability, CheckpointIndex, CheckpointReport, ContractRequest, DType, EncoderCompute, EncoderGraph,
    EncoderGraphRequest, EncoderTarget, LayoutRequest, MediaItem, Modality, ModelConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};
use crate::version::{API_VERSION, ApiVersion, SUPPORTED_VERSIONS};

/// Whether the host serves capabilities that are not `qualified`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QualificationPolicy {
    /// Set by `--allow-unqualified`: serve `experimental` capabilities too.
    pub allow_unqualified: bool,
}

/// What the loader requires of where plugins come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirPolicy {
    /// Set by `--allow-unsafe-plugin-dir`: load from a directory, manifests and libraries that
    /// others can write to, and through symlinks that leave the directory.
    pub allow_unsafe: bool,
}

impl DirPolicy {
    /// Refuses `dir` when others can write to it (they could swap a library in).
    fn check_dir(self, dir: &Path) -> Result<()> {
        if self.allow_unsafe {
            return Ok(());
        }
        let meta = std::fs::metadata(dir).map_err(|source| Error::Io { path: dir.to_owned(), source })?;
        if world_writable(&meta) {
            return Err(Error::UnsafePath { path: dir.to_owned(), reason: "is writable by every user".into() });
        }
        Ok(())
    }

    /// Refuses `file` when it resolves outside `dir` (a symlink leading out) or others can
    /// write to it.
    fn check_file(self, file: &Path, dir: &Path) -> Result<()> {
        if self.allow_unsafe {
            return Ok(());
        }
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        let (real, home) = (file.canonicalize().map_err(io(file))?, dir.canonicalize().map_err(io(dir))?);
        if real.parent() != Some(home.as_path()) {
            return Err(Error::UnsafePath {
                path: file.to_owned(),
                reason: format!("resolves to {}, outside the plugin directory {}", real.display(), home.display()),
            });
        }
        let meta = std::fs::metadata(&real).map_err(io(&real))?;
        if world_writable(&meta) {
            return Err(Error::UnsafePath { path: file.to_owned(), reason: "is writable by every user".into() });
        }
        Ok(())
    }
}

#[cfg(unix)]
fn world_writable(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o002 != 0
}

#[cfg(not(unix))]
fn world_writable(_meta: &std::fs::Metadata) -> bool {
    false
}

/// A plugin that passed every load check.
pub struct LoadedPlugin {
    manifest: Manifest,
    manifest_path: PathBuf,
    library_path: PathBuf,
    api_version: ApiVersion,
    identity: PluginIdentity,
    module: Table,
}

// The host calls plugins from a worker pool: a loaded plugin must be shareable across threads.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<LoadedPlugin>();
    shareable::<PluginSet>();
};

impl fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.manifest.plugin.name)
            .field("version", &self.manifest.plugin.version)
            .field("api_version", &self.api_version)
            .field("library_path", &self.library_path)
            .finish_non_exhaustive()
    }
}

/// A plugin (or stray library) that was skipped, and why.
#[derive(Debug)]
pub struct Rejection {
    /// The manifest, or the library for a library without a manifest.
    pub path: PathBuf,
    /// The plugin name, when the manifest got far enough to tell.
    pub plugin: Option<String>,
    /// The reason.
    pub error: Error,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.plugin {
            Some(name) => write!(f, "skipped plugin `{name}` ({}): {}", self.path.display(), self.error),
            None => write!(f, "skipped {}: {}", self.path.display(), self.error),
        }
    }
}

/// The result of scanning a plugin directory.
#[derive(Debug, Default)]
pub struct PluginSet {
    plugins: Vec<LoadedPlugin>,
    rejected: Vec<Rejection>,
}

/// Loads every plugin in `dir` under the default [`DirPolicy`] (see [`scan_with`]).
pub fn scan(dir: &Path) -> Result<PluginSet> {
    scan_with(dir, DirPolicy::default())
}

/// Loads every plugin in `dir`: each `*.toml` manifest with the library it names. Libraries
/// no manifest names are reported too. Fails only if `dir` cannot be listed or `policy`
/// refuses it.
pub fn scan_with(dir: &Path, policy: DirPolicy) -> Result<PluginSet> {
    policy.check_dir(dir)?;
    let io = |source| Error::Io { path: dir.to_owned(), source };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::result::Result<_, _>>()
        .map_err(io)?;
    entries.sort();

    let mut set = PluginSet::default();
    let mut named_libraries = Vec::new();
    for path in entries.iter().filter(|p| p.extension().is_some_and(|e| e == "toml")) {
        if let Ok(manifest) = Manifest::from_file(path) {
            named_libraries.push(dir.join(&manifest.plugin.library));
        }
        match load_plugin_in(path, policy) {
            Ok(plugin) => set.plugins.push(plugin),
            Err(error) => {
                let plugin = manifest_name(path);
                set.rejected.push(Rejection { path: path.clone(), plugin, error });
            }
        }
    }
    let library_suffix = std::env::consts::DLL_EXTENSION;
    for path in entries.iter().filter(|p| p.extension().is_some_and(|e| e == library_suffix)) {
        if !named_libraries.contains(path) {
            set.rejected.push(Rejection {
                path: path.clone(),
                plugin: None,
                error: Error::NoManifest { path: path.clone() },
            });
        }
    }
    set.reject_duplicate_claims();
    Ok(set)
}

/// The `[plugin] name` of a manifest that may not validate, for rejection reports.
fn manifest_name(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let value: toml::Table = toml::from_str(&text).ok()?;
    value.get("plugin")?.get("name")?.as_str().map(str::to_owned)
}

/// Loads one plugin from its manifest, through every check in the module docs, under the
/// default [`DirPolicy`]; its directory is checked as [`scan_with`] checks one.
pub fn load_plugin(manifest_path: &Path) -> Result<LoadedPlugin> {
    let policy = DirPolicy::default();
    policy.check_dir(manifest_path.parent().unwrap_or(Path::new(".")))?;
    load_plugin_in(manifest_path, policy)
}

fn load_plugin_in(manifest_path: &Path, policy: DirPolicy) -> Result<LoadedPlugin> {
    let dir = manifest_path.parent().unwrap_or(Path::new("."));
    policy.check_file(manifest_path, dir)?;
    let manifest = Manifest::from_file(manifest_path)?;
    let name = manifest.plugin.name.clone();
    let declared = manifest.plugin_api();
    if !loadable(declared) {
        return Err(incompatible(&name, declared));
    }

    let library_path = dir.join(&manifest.plugin.library);
    policy.check_file(&library_path, dir)?;
    let bytes = std::fs::read(&library_path).map_err(|source| Error::Io { path: library_path.clone(), source })?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != manifest.plugin.sha256 {
        return Err(Error::ShaMismatch { path: library_path, expected: manifest.plugin.sha256.clone(), actual });
    }

    let OpenedLibrary { declared: library_version, table: module } =
        open_library(&library_path, loadable).map_err(|e| match e {
            RawLoadError::Open(reason) => Error::LibraryOpen { path: library_path.clone(), reason },
            RawLoadError::MissingSymbol(symbol) => Error::MissingSymbol { path: library_path.clone(), symbol },
            RawLoadError::BadVersionSymbol => {
                Error::AbiCheck { path: library_path.clone(), reason: "the version symbol lacks its magic".to_owned() }
            }
            RawLoadError::Incompatible(version) => incompatible(&name, version),
            RawLoadError::HeaderDisagrees { symbol, header } => Error::AbiCheck {
                path: library_path.clone(),
                reason: format!("the version symbol says {symbol} but the abi_stable header says {header}"),
            },
            RawLoadError::AbiStable(reason) => Error::AbiCheck { path: library_path.clone(), reason },
        })?;
    if library_version != declared {
        return Err(mismatch(&name, "plugin_api", declared, library_version));
    }

    let identity = call(&name, "identity", (module.identity())())?;
    check_identity(&manifest, &identity)?;
    Ok(LoadedPlugin {
        manifest,
        manifest_path: manifest_path.to_owned(),
        library_path,
        api_version: library_version,
        identity,
        module,
    })
}

/// Whether this host loads a plugin built against `version`.
fn loadable(version: ApiVersion) -> bool {
    API_VERSION.can_load(version) && SUPPORTED_VERSIONS.contains(&version)
}

fn incompatible(plugin: &str, plugin_version: ApiVersion) -> Error {
    let hint = if plugin_version.major != API_VERSION.major {
        "rebuild the plugin against this host's plugin-api major version"
    } else {
        "upgrade the host, or rebuild the plugin against an older plugin-api minor"
    };
    Error::IncompatibleApi { plugin: plugin.to_owned(), plugin_version, host_version: API_VERSION, hint }
}

fn mismatch(plugin: &str, field: &'static str, manifest: impl fmt::Display, library: impl fmt::Display) -> Error {
    Error::ManifestMismatch {
        plugin: plugin.to_owned(),
        field,
        manifest: manifest.to_string(),
        library: library.to_string(),
    }
}

/// Compares what the library says about itself with what its manifest says.
fn check_identity(manifest: &Manifest, identity: &PluginIdentity) -> Result<()> {
    let name = &manifest.plugin.name;
    if identity.name.as_str() != name {
        return Err(mismatch(name, "name", name, &identity.name));
    }
    if identity.version.as_str() != manifest.plugin.version {
        return Err(mismatch(name, "version", &manifest.plugin.version, &identity.version));
    }
    let listed = |values: &mut Vec<String>| {
        values.sort();
        values.dedup();
        values.join(", ")
    };
    let pairs: [(&'static str, Vec<String>, Vec<String>); 4] = [
        (
            "architectures",
            manifest.accepts.architectures.clone(),
            identity.architectures.iter().map(|s| s.to_string()).collect(),
        ),
        (
            "model_types",
            manifest.accepts.model_types.clone(),
            identity.model_types.iter().map(|s| s.to_string()).collect(),
        ),
        (
            "modalities",
            manifest.modalities.clone(),
            identity.modalities.iter().map(|m| m.as_str().to_owned()).collect(),
        ),
        (
            "capabilities",
            manifest.capabilities.keys().cloned().collect(),
            identity.capabilities.iter().map(|c| c.as_str().to_owned()).collect(),
        ),
    ];
    for (field, mut in_manifest, mut in_library) in pairs {
        let (m, l) = (listed(&mut in_manifest), listed(&mut in_library));
        if m != l {
            return Err(mismatch(name, field, format!("[{m}]"), format!("[{l}]")));
        }
    }
    Ok(())
}

fn call<T>(plugin: &str, entry: &'static str, result: RResult<T, PluginError>) -> Result<T> {
    result.into_result().map_err(|error| Error::Plugin { plugin: plugin.to_owned(), entry, error })
}

/// What is wrong with a plugin's preprocessed item, if anything: the host pads, hashes and
/// uploads these bytes, so each tensor must fill its shape exactly, and an input that is not a
/// finite number would reach the encoder as one (a NaN spreads to every logit it touches).
fn check_preprocessed(item: &Preprocessed) -> std::result::Result<(), String> {
    if item.tensors.is_empty() {
        return Err("no tensors".to_owned());
    }
    for tensor in item.tensors.iter() {
        tensor.validate().map_err(|e| e.message.to_string())?;
        let data = tensor.data.as_slice();
        let first_bad = match tensor.spec.dtype {
            DType::F32 => data.chunks_exact(4).position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
            // An all-ones exponent is infinity or NaN in both 16-bit forms.
            DType::BF16 => data.chunks_exact(2).position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
            DType::F16 => data.chunks_exact(2).position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
            DType::I32 | DType::I64 | DType::U8 | DType::Bool => None,
        };
        if let Some(index) = first_bad {
            return Err(format!(
                "tensor `{}` {:?} holds a value that is not finite at flat index {index}",
                tensor.spec.name,
                tensor.spec.shape.as_slice()
            ));
        }
    }
    if item.grid.feature_tokens == 0 {
        return Err("the item's grid has no feature rows".to_owned());
    }
    Ok(())
}

impl PluginSet {
    /// The plugins that loaded, in manifest file order.
    pub fn plugins(&self) -> &[LoadedPlugin] {
        &self.plugins
    }

    /// Everything that was skipped, with reasons.
    pub fn rejected(&self) -> &[Rejection] {
        &self.rejected
    }

    /// The loaded plugin with this name.
    pub fn get(&self, name: &str) -> Option<&LoadedPlugin> {
        self.plugins.iter().find(|p| p.name() == name)
    }

    /// The plugin that accepts a checkpoint config (`config.json` text): by its first
    /// `architectures` entry, else by `model_type`.
    pub fn for_config(&self, config_json: &str) -> Result<&LoadedPlugin> {
        let value: serde_json::Value =
            serde_json::from_str(config_json).map_err(|e| Error::BadConfig { reason: e.to_string() })?;
        let architecture =
            value.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str()).unwrap_or_default();
        let model_type = value.get("model_type").and_then(|m| m.as_str()).unwrap_or_default();
        self.plugins
            .iter()
            .find(|p| !architecture.is_empty() && p.manifest.accepts.architectures.iter().any(|a| a == architecture))
            .or_else(|| {
                self.plugins
                    .iter()
                    .find(|p| !model_type.is_empty() && p.manifest.accepts.model_types.iter().any(|m| m == model_type))
            })
            .ok_or_else(|| Error::NoPlugin { architecture: architecture.to_owned(), model_type: model_type.to_owned() })
    }

    /// Moves every plugin that shares a name, architecture or model type with another loaded
    /// plugin to the rejected list. Which one the user meant cannot be decided from directory
    /// order, so neither is served.
    fn reject_duplicate_claims(&mut self) {
        let mut claims: BTreeMap<(&'static str, String), Vec<usize>> = BTreeMap::new();
        for (index, plugin) in self.plugins.iter().enumerate() {
            let m = &plugin.manifest;
            claims.entry(("name", m.plugin.name.clone())).or_default().push(index);
            for a in &m.accepts.architectures {
                claims.entry(("architecture", a.clone())).or_default().push(index);
            }
            for t in &m.accepts.model_types {
                claims.entry(("model_type", t.clone())).or_default().push(index);
            }
        }
        let mut reasons: BTreeMap<usize, Error> = BTreeMap::new();
        for ((kind, value), indices) in claims {
            let mut indices = indices;
            indices.dedup();
            if indices.len() < 2 {
                continue;
            }
            for &index in &indices {
                let others: Vec<String> = indices
                    .iter()
                    .filter(|&&i| i != index)
                    .map(|&i| format!("{} ({})", self.plugins[i].name(), self.plugins[i].manifest_path.display()))
                    .collect();
                reasons.entry(index).or_insert_with(|| Error::DuplicateClaim {
                    plugin: self.plugins[index].name().to_owned(),
                    kind,
                    value: value.clone(),
                    others: others.join(", "),
                });
            }
        }
        for (index, error) in reasons.into_iter().rev() {
            let plugin = self.plugins.remove(index);
            self.rejected.push(Rejection {
                path: plugin.manifest_path,
                plugin: Some(plugin.manifest.plugin.name),
                error,
            });
        }
    }
}

impl LoadedPlugin {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.manifest.plugin.name
    }

    /// Its validated manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Where the manifest was read from.
    pub fn manifest_path(&self) -> &Path {
        &self.manifest_path
    }

    /// The library file.
    pub fn library_path(&self) -> &Path {
        &self.library_path
    }

    /// The plugin-api version the library was built against.
    pub fn api_version(&self) -> ApiVersion {
        self.api_version
    }

    /// What the library said about itself at load time.
    pub fn identity(&self) -> &PluginIdentity {
        &self.identity
    }

    /// Gates a capability: `Ok(status)` if the host may serve it under `policy`, otherwise a
    /// typed error whose message names the opt-in flag where one would help.
    pub fn check_capability(&self, capability: Capability, policy: QualificationPolicy) -> Result<Status> {
        check_capability(&self.manifest, capability, policy)
    }

    /// Whether media from a checkpoint of `form` (of `manifest::FORMS`) is served under `policy`.
    pub fn check_form(&self, form: &str, policy: QualificationPolicy) -> Result<Status> {
        let entry = self.manifest.form(form).map(|e| e.status);
        match entry {
            Some(Status::Qualified) => Ok(Status::Qualified),
            Some(Status::Experimental) if policy.allow_unqualified => Ok(Status::Experimental),
            status => Err(Error::form(self.name(), form, status)),
        }
    }

    /// Calls `identity` again (it was called once at load).
    pub fn call_identity(&self) -> Result<PluginIdentity> {
        call(self.name(), "identity", (self.module.identity())())
    }

    /// Parses a checkpoint's `config.json` and processor config text.
    pub fn parse_config(&self, config_json: &str, processor_json: &str) -> Result<ModelConfig> {
        let f = self.module.parse_config();
        call(self.name(), "parse_config", f(RStr::from_str(config_json), RStr::from_str(processor_json)))
    }

    /// Expands the placeholders of one request.
    pub fn prompt_layout(&self, config: &ModelConfig, request: &LayoutRequest) -> Result<PromptLayout> {
        call(self.name(), "prompt_layout", (self.module.prompt_layout())(config, request))
    }

    /// Preprocesses one item.
    pub fn preprocess(
        &self,
        config: &ModelConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed> {
        let preprocessed = call(self.name(), "preprocess", (self.module.preprocess())(config, item, options))?;
        check_preprocessed(&preprocessed).map_err(|problem| Error::Malformed {
            plugin: self.name().to_owned(),
            entry: "preprocess",
            problem,
        })?;
        Ok(preprocessed)
    }

    /// The encoder's shape buckets for a modality.
    pub fn encoder_buckets(&self, config: &ModelConfig, modality: Modality) -> Result<Vec<ShapeBucket>> {
        call(self.name(), "encoder_buckets", (self.module.encoder_buckets())(config, modality))
            .map(|buckets| buckets.into_vec())
    }

    /// The encoder graph for one bucket, laid out for `target` (1.3 and later) and computing in
    /// `compute` (1.4 and later). A plugin that predates 1.3 lays it out for a target not known,
    /// which computes the same results (the host serves its weights in whatever tiles the graph
    /// declares); one that predates 1.4 computes in f32 only, and any other compute is refused
    /// here, naming its version.
    pub fn encoder_graph(
        &self,
        config: &ModelConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph> {
        if let Some(f) = self.module.encoder_graph_compute() {
            return call(self.name(), "encoder_graph_compute", f(config, request, target, compute));
        }
        if compute != EncoderCompute::F32 {
            let error = PluginError::unsupported(format!(
                "the plugin is built against plugin-api {}, whose encoders compute in f32 only; an encoder in {} \
                 needs a plugin built against 1.4 or later",
                self.api_version(),
                compute.name()
            ));
            return Err(Error::Plugin { plugin: self.name().to_owned(), entry: "encoder_graph_compute", error });
        }
        match self.module.encoder_graph_for() {
            Some(f) => call(self.name(), "encoder_graph_for", f(config, request, target)),
            None => call(self.name(), "encoder_graph", (self.module.encoder_graph())(config, request)),
        }
    }

    /// The prepared-prefill program for one tokenized request: the plugin's own (1.2 and
    /// later), or its 1.0 contract converted.
    pub fn prefill_program(&self, config: &ModelConfig, request: &ContractRequest) -> Result<PrefillProgram> {
        match self.module.prefill_program() {
            Some(f) => call(self.name(), "prefill_program", f(config, request)),
            None => {
                let contract =
                    call(self.name(), "prefill_contract", (self.module.prefill_contract())(config, request))?;
                Ok(contract.into())
            }
        }
    }

    /// Checks a checkpoint's tensor index; `Ok(None)` when the plugin predates plugin-api 1.1
    /// and has no such entry.
    pub fn check_checkpoint(&self, config: &ModelConfig, index: &CheckpointIndex) -> Result<Option<CheckpointReport>> {
        match self.module.check_checkpoint() {
            Some(f) => call(self.name(), "check_checkpoint", f(config, index)).map(Some),
            None => Ok(None),
        }
    }

    /// The family's own text decoder spec; `Ok(None)` when it brings none (it predates
    /// plugin-api 1.2, or its language model is a preset). A spec the decoder library cannot
    /// read (another schema, an unknown field) is the plugin's error, naming the entry.
    pub fn decoder_spec(&self, config: &ModelConfig) -> Result<Option<mlxcel_decoder::DecoderSpec>> {
        let Some(f) = self.module.decoder_spec() else { return Ok(None) };
        let Some(json) = call(self.name(), "decoder_spec", f(config))?.into_option() else { return Ok(None) };
        mlxcel_decoder::DecoderSpec::from_json(json.as_str()).map(Some).map_err(|e| Error::Plugin {
            plugin: self.name().to_owned(),
            entry: "decoder_spec",
            error: PluginError::new(crate::ErrorCode::Internal, e.to_string()),
        })
    }
}

/// The capability gate on a manifest: `qualified` is always served, `experimental` only with
/// `policy.allow_unqualified` (the `--allow-unqualified` flag), `unsupported` or undeclared
/// never.
pub fn check_capability(manifest: &Manifest, capability: Capability, policy: QualificationPolicy) -> Result<Status> {
    let plugin = manifest.plugin.name.clone();
    match manifest.capability(capability).map(|entry| entry.status) {
        Some(Status::Qualified) => Ok(Status::Qualified),
        Some(Status::Experimental) if policy.allow_unqualified => Ok(Status::Experimental),
        Some(status @ Status::Experimental) => Err(Error::Unqualified { plugin, capability, status }),
        Some(Status::Unsupported) | None => Err(Error::Unsupported { plugin, capability }),
    }
}

#[cfg(test)]
mod tests {
    use super::check_preprocessed;
    use crate::types::{DType, MediaGrid, Preprocessed, Tensor, TensorSpec};

    fn item(tensors: Vec<Tensor>, feature_tokens: u32) -> Preprocessed {
        Preprocessed { tensors: tensors.into(), grid: MediaGrid { dims: vec![1, 2].into(), feature_tokens } }
    }

    fn half(name: &str, dtype: DType, bits: &[u16]) -> Tensor {
        let data: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        Tensor { spec: TensorSpec::new(name, dtype, &[bits.len() as u64]), data: data.into() }
    }

    #[test]
    fn a_preprocessed_item_is_refused_for_values_that_are_not_finite_a_short_tensor_or_no_rows() {
        let good = Tensor::from_f32("x", &[2], &[1.0, -2.5]).expect("tensor");
        assert_eq!(check_preprocessed(&item(vec![good.clone()], 2)), Ok(()));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let t = Tensor::from_f32("x", &[2], &[1.0, bad]).expect("tensor");
            let problem = check_preprocessed(&item(vec![t], 2)).expect_err("refused");
            assert!(problem.contains("tensor `x` [2] holds a value that is not finite at flat index 1"), "{problem}");
        }
        // bf16 and f16: 1.0, then infinity and a NaN in each form.
        assert_eq!(check_preprocessed(&item(vec![half("b", DType::BF16, &[0x3f80, 0xc000])], 1)), Ok(()));
        assert_eq!(check_preprocessed(&item(vec![half("h", DType::F16, &[0x3c00, 0xc000])], 1)), Ok(()));
        for (dtype, bits) in [
            (DType::BF16, [0x3f80, 0x7f80]),
            (DType::BF16, [0x3f80, 0xffc1]),
            (DType::F16, [0x3c00, 0x7c00]),
            (DType::F16, [0x3c00, 0xfe00]),
        ] {
            let problem = check_preprocessed(&item(vec![half("w", dtype, &bits)], 1)).expect_err("refused");
            assert!(problem.contains("not finite at flat index 1"), "{problem}");
        }
        let mut short = good.clone();
        short.data = short.data.as_slice()[..7].to_vec().into();
        assert!(check_preprocessed(&item(vec![short], 2)).expect_err("refused").contains("has 7 bytes"));
        assert_eq!(check_preprocessed(&item(vec![], 2)), Err("no tensors".to_owned()));
        assert!(check_preprocessed(&item(vec![good], 0)).expect_err("refused").contains("no feature rows"));
    }
}
