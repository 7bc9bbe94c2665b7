//! The plugin-api version: what a plugin was built against and whether a host can load it.
//!
//! The ABI follows the PJRT rules. MAJOR changes when anything is deleted, retyped or
//! rearranged; MINOR changes when an entry is appended to the root module or a new type is
//! added. A host at `M.n` loads a plugin built at `M.k` for every `k <= n`: the entries the
//! plugin does not have read as absent. A plugin built at a newer minor than the host is
//! refused, because it may rely on host behaviour that minor introduced.
//!
//! The crate's package version follows this version (`1.4.0`), not the workspace: abi_stable
//! records the package version in every type layout and refuses a plugin whose package major
//! differs (for `0.x`, whose minor differs), so tying it to the ABI keeps plugins built against
//! any release of the same major loadable.

use std::fmt;
use std::str::FromStr;

use abi_stable::StableAbi;

/// A plugin-api ABI version, `major.minor`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    /// Incremented on any breaking change to the ABI.
    pub major: u32,
    /// Incremented when entries or types are appended.
    pub minor: u32,
}

/// The plugin-api version this crate implements.
///
/// History:
/// - 1.0: identity, parse_config, prompt_layout, preprocess, encoder_buckets, encoder_graph,
///   prefill_contract;
/// - 1.1: check_checkpoint (appended);
/// - 1.2: decoder_spec (appended): a family's own text decoder, as `mlxcel_decoder::DecoderSpec`;
///   prefill_program (appended): the prepared-prefill contract as a program;
/// - 1.3: encoder_graph_for (appended): the encoder laid out for the target CPU's vectors
///   (`EncoderTarget`); a plugin's source gives `FamilyPlugin::encoder_graph` the target;
/// - 1.4: encoder_graph_compute (appended): the encoder computing in the compute the host asks
///   for (`EncoderCompute`: f32, or bf16 with either of its sums); a plugin's source gives
///   `FamilyPlugin::encoder_graph` the compute.
pub const API_VERSION: ApiVersion = ApiVersion { major: 1, minor: 4 };

/// Every version this host loads, oldest first: the load window. Each entry has a frozen
/// root-module table in the ABI module; a test walks the window with fixture plugins.
pub const SUPPORTED_VERSIONS: [ApiVersion; 5] =
    [ApiVersion::new(1, 0), ApiVersion::new(1, 1), ApiVersion::new(1, 2), ApiVersion::new(1, 3), API_VERSION];

impl ApiVersion {
    /// Builds a version from its parts.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// Whether a host implementing `self` can load a plugin built against `plugin` by the
    /// versioning rules (this host also needs the plugin's version in [`SUPPORTED_VERSIONS`]).
    ///
    /// This is semver's caret rule seen from the plugin: the plugin requires `^plugin`, and the
    /// host's version must satisfy it.
    pub fn can_load(self, plugin: ApiVersion) -> bool {
        let requirement = semver::VersionReq {
            comparators: vec![semver::Comparator {
                op: semver::Op::Caret,
                major: u64::from(plugin.major),
                minor: Some(u64::from(plugin.minor)),
                patch: None,
                pre: semver::Prerelease::EMPTY,
            }],
        };
        let host = semver::Version::new(u64::from(self.major), u64::from(self.minor), 0);
        requirement.matches(&host)
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The error for a version string that is not `MAJOR.MINOR` (or `MAJOR.MINOR.PATCH`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid plugin-api version `{0}`: expected MAJOR.MINOR")]
pub struct ParseApiVersionError(pub String);

impl FromStr for ApiVersion {
    type Err = ParseApiVersionError;

    /// Parses `MAJOR.MINOR`; a `.PATCH` suffix is accepted and ignored, because patches never
    /// change the ABI.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseApiVersionError(s.to_owned());
        let mut parts = s.trim().split('.');
        let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(err)?;
        let minor = parts.next().and_then(|p| p.parse().ok()).ok_or_else(err)?;
        match (parts.next(), parts.next()) {
            (None, None) => {}
            (Some(patch), None) if patch.parse::<u32>().is_ok() => {}
            _ => return Err(err()),
        }
        Ok(Self { major, minor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(host: &str, plugin: &str, expect: bool) {
        let host: ApiVersion = host.parse().expect("invariant: test versions parse");
        let plugin: ApiVersion = plugin.parse().expect("invariant: test versions parse");
        assert_eq!(host.can_load(plugin), expect, "host {host} plugin {plugin}");
    }

    #[test]
    fn same_major_older_or_equal_minor_loads() {
        check("1.1", "1.0", true);
        check("1.1", "1.1", true);
        check("1.4", "1.0", true);
    }

    #[test]
    fn newer_minor_or_other_major_is_refused() {
        check("1.1", "1.2", false);
        check("1.1", "2.0", false);
        check("2.0", "1.9", false);
        check("1.1", "0.1", false);
    }

    #[test]
    fn parsing_accepts_patch_and_rejects_junk() {
        assert_eq!("1.2.7".parse::<ApiVersion>(), Ok(ApiVersion::new(1, 2)));
        assert!("1".parse::<ApiVersion>().is_err());
        assert!("1.x".parse::<ApiVersion>().is_err());
        assert!("1.2.3.4".parse::<ApiVersion>().is_err());
        assert_eq!(API_VERSION.to_string(), "1.4");
    }

    #[test]
    fn the_load_window_ends_at_this_version_and_obeys_the_rules() {
        assert_eq!(SUPPORTED_VERSIONS.last(), Some(&API_VERSION));
        assert!(SUPPORTED_VERSIONS.iter().all(|v| API_VERSION.can_load(*v)));
    }
}
