//! `plugins list|inspect|verify`: the family plugins of a plugin directory, one plugin's whole
//! manifest, and the conformance kit that checks a plugin against a fixture's goldens.
//!
//! Loading, validation and the capability gate are `mlxcel_plugin_api`'s; this module only
//! reports what they decided.

mod tokens;
mod verify;

use std::path::PathBuf;

use anyhow::{Result, bail};
use mlxcel_plugin_api::{
    ALLOW_UNQUALIFIED_FLAG, DirPolicy, Error as PluginApiError, LoadedPlugin, Manifest, PluginSet, QualificationPolicy,
    Status, scan_with,
};

/// The environment variable naming the default plugin directory.
const PLUGINS_ENV: &str = "MLXCEL_PLUGINS";

#[derive(Debug, clap::Subcommand)]
pub(crate) enum PluginsCommand {
    /// List the plugins that load (family, versions, architectures, each capability's status)
    /// and every plugin that was skipped, with the reason.
    List {
        #[command(flatten)]
        dir: PluginDir,
        /// Count capabilities that are not qualified as served, as the host does when started
        /// with this flag.
        #[arg(long)]
        allow_unqualified: bool,
    },
    /// Print one plugin's whole manifest: library, accepted checkpoints, limits, and each
    /// capability's status with its evidence.
    Inspect {
        /// The plugin name, as `plugins list` shows it.
        name: String,
        #[command(flatten)]
        dir: PluginDir,
    },
    /// Check a plugin against a fixture's goldens stage by stage (the conformance kit).
    Verify(verify::VerifyArgs),
}

/// Where the plugins are.
#[derive(Debug, clap::Args)]
pub(crate) struct PluginDir {
    /// The plugin directory: libraries with their manifests [default: $MLXCEL_PLUGINS].
    #[arg(long = "plugins", value_name = "DIR", env = PLUGINS_ENV)]
    plugins: Option<PathBuf>,
    /// Load plugins from a directory, manifests or libraries that other users can write to,
    /// and through symlinks that lead out of the directory (refused by default: a plugin runs
    /// inside the host).
    #[arg(long)]
    allow_unsafe_plugin_dir: bool,
}

impl PluginDir {
    /// The directory, when one was given.
    pub(crate) fn dir(&self) -> Option<&std::path::Path> {
        self.plugins.as_deref()
    }

    pub(crate) fn scan(&self) -> Result<(PathBuf, PluginSet)> {
        let Some(dir) = &self.plugins else {
            bail!("no plugin directory: pass --plugins <dir> or set {PLUGINS_ENV}");
        };
        let set = scan_with(dir, DirPolicy { allow_unsafe: self.allow_unsafe_plugin_dir })?;
        // What runs inside the host, by content: the hash each library was checked against.
        for plugin in set.plugins() {
            eprintln!(
                "plugin {} {}: {} (sha256 {})",
                plugin.name(),
                plugin.manifest().plugin.version,
                plugin.library_path().display(),
                plugin.manifest().plugin.sha256
            );
        }
        Ok((dir.clone(), set))
    }
}

pub(crate) fn run(command: &PluginsCommand) -> Result<()> {
    match command {
        PluginsCommand::List { dir, allow_unqualified } => {
            list(dir, QualificationPolicy { allow_unqualified: *allow_unqualified })
        }
        PluginsCommand::Inspect { name, dir } => inspect(dir, name),
        PluginsCommand::Verify(args) => verify::run(args),
    }
}

fn list(dir: &PluginDir, policy: QualificationPolicy) -> Result<()> {
    let (path, set) = dir.scan()?;
    println!("plugin directory {}: {} loaded, {} skipped", path.display(), set.plugins().len(), set.rejected().len());
    for plugin in set.plugins() {
        println!();
        print!("{}", describe(plugin, policy));
    }
    if !set.rejected().is_empty() {
        println!();
        println!("skipped:");
        for rejection in set.rejected() {
            println!("  {rejection}");
        }
    }
    Ok(())
}

/// One loaded plugin as `list` shows it.
fn describe(plugin: &LoadedPlugin, policy: QualificationPolicy) -> String {
    let manifest = plugin.manifest();
    let mut out = format!(
        "{} {}  plugin-api {}  {}\n",
        plugin.name(),
        manifest.plugin.version,
        plugin.api_version(),
        plugin.library_path().display()
    );
    out += &format!("  architectures: {}\n", list_or_none(&manifest.accepts.architectures));
    out += &format!("  model types:   {}\n", list_or_none(&manifest.accepts.model_types));
    out += &format!("  modalities:    {}\n", list_or_none(&manifest.modalities));
    out += "  capabilities:\n";
    for (capability, entry) in manifest.capabilities() {
        let served = match plugin.check_capability(capability, policy) {
            Ok(_) => "served".to_owned(),
            Err(PluginApiError::Unqualified { .. }) => {
                format!("not served (start the host with {ALLOW_UNQUALIFIED_FLAG} to serve it)")
            }
            Err(PluginApiError::Unsupported { .. }) => "never served".to_owned(),
            Err(other) => format!("not served: {other}"),
        };
        out += &format!("    {:<12} {:<13} {served}\n", capability.as_str(), entry.status.to_string());
        if let Some(note) = &entry.note {
            out += &format!("      note: {note}\n");
        }
    }
    if !manifest.forms.is_empty() {
        out += "  checkpoint forms:\n";
    }
    for (form, entry) in &manifest.forms {
        let served = match plugin.check_form(form, policy) {
            Ok(_) => "served".to_owned(),
            Err(_) if entry.status == Status::Experimental => {
                format!("not served (start the host with {ALLOW_UNQUALIFIED_FLAG} to serve it)")
            }
            Err(_) => "never served".to_owned(),
        };
        out += &format!("    {form:<12} {:<13} {served}\n", entry.status.to_string());
        if let Some(stage) = &entry.first_divergence {
            out += &format!("      first divergence: {stage}\n");
        }
        if let Some(note) = &entry.note {
            out += &format!("      note: {note}\n");
        }
    }
    out
}

fn list_or_none(values: &[String]) -> String {
    if values.is_empty() { "(none)".to_owned() } else { values.join(", ") }
}

fn inspect(dir: &PluginDir, name: &str) -> Result<()> {
    let (path, set) = dir.scan()?;
    if let Some(plugin) = set.get(name) {
        let identity = plugin.identity();
        println!("# {} {} (plugin-api {})", plugin.name(), plugin.manifest().plugin.version, plugin.api_version());
        println!("# manifest: {}", plugin.manifest_path().display());
        println!("# library:  {}", plugin.library_path().display());
        for reference in identity.references.iter() {
            println!("# reference: {reference}");
        }
        println!();
        print!("{}", plugin.manifest().to_toml());
        return Ok(());
    }
    if let Some(rejection) = set.rejected().iter().find(|r| r.plugin.as_deref() == Some(name)) {
        // Show what the manifest claims when it parses, then why the plugin was skipped.
        if let Ok(manifest) = Manifest::from_file(&rejection.path) {
            println!("# manifest: {}", rejection.path.display());
            println!();
            print!("{}", manifest.to_toml());
        }
        bail!("plugin `{name}` was skipped: {}", rejection.error);
    }
    let loaded: Vec<&str> = set.plugins().iter().map(LoadedPlugin::name).collect();
    bail!("no plugin `{name}` in {} (loaded: {})", path.display(), list_or_none_str(&loaded));
}

fn list_or_none_str(values: &[&str]) -> String {
    if values.is_empty() { "none".to_owned() } else { values.join(", ") }
}
