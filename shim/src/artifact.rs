//! Compiled modules as the host keeps them: the VMFB plus what it needs from
//! the outside (its parameters), stamped with the compiler that made it, in a
//! self-checking file format for the compile cache.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::{
    error::{Error, Result},
    tensor::TensorDesc,
};

const MAGIC: &[u8; 12] = b"MLXCELVMFB1\n";

/// A parameter the module reads by name, as declared in its MLIR.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParameterDecl {
    pub scope: String,
    pub key: String,
    /// The declared tensor type, when the declaration spells one the runtime moves.
    pub desc: Option<TensorDesc>,
    /// The declared type as written (`tensor<64x64xi4>`), for the types `desc` cannot hold.
    #[serde(default)]
    pub ty: String,
}

/// Finds every `#flow.parameter.named<"scope"::"key"> : tensor<...>` (or the
/// `#stream` spelling) in MLIR text. Keys are deduplicated, in order.
pub fn parameter_decls(mlir: &str) -> Vec<ParameterDecl> {
    let mut out: Vec<ParameterDecl> = Vec::new();
    for marker in ["#flow.parameter.named<", "#stream.parameter.named<"] {
        let mut rest = mlir;
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            let Some((first, after)) = quoted(rest) else { continue };
            let (scope, key, after) = match after.strip_prefix("::").and_then(quoted) {
                Some((key, after)) => (first, key, after),
                None => ("", first, after),
            };
            let after = after.trim_start().strip_prefix('>').unwrap_or(after).trim_start();
            let ty = after
                .strip_prefix(':')
                .and_then(|t| {
                    let t = t.trim_start();
                    Some(&t[..=t.find('>')?])
                })
                .unwrap_or_default();
            let desc = TensorDesc::from_mlir(ty);
            if !out.iter().any(|d| d.scope == scope && d.key == key) {
                out.push(ParameterDecl { scope: scope.to_owned(), key: key.to_owned(), desc, ty: ty.to_owned() });
            }
            rest = after;
        }
    }
    out
}

/// Splits `"text"rest` into `text` and `rest`.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let s = s.strip_prefix('"')?;
    let end = s.find('"')?;
    Some((&s[..end], &s[end + 1..]))
}

/// What an artifact records about how it was made.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArtifactMeta {
    /// The name used in messages (e.g. `qwen2.decoder`).
    pub name: String,
    /// The cache key it was stored under.
    pub key: String,
    pub compiler_revision: String,
    pub target: String,
    pub parameters: Vec<ParameterDecl>,
    /// The numeric contract the module was emitted under (its descriptor's JSON), when stated.
    #[serde(default)]
    pub contract: Option<String>,
    vmfb_len: u64,
    vmfb_sha256: String,
}

/// A compiled module and its provenance.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub meta: ArtifactMeta,
    pub vmfb: Vec<u8>,
}

impl Artifact {
    pub fn new(name: &str, key: &str, compiler_revision: &str, target: &str, mlir: &str, vmfb: Vec<u8>) -> Self {
        let meta = ArtifactMeta {
            name: name.to_owned(),
            key: key.to_owned(),
            compiler_revision: compiler_revision.to_owned(),
            target: target.to_owned(),
            parameters: parameter_decls(mlir),
            contract: None,
            vmfb_len: vmfb.len() as u64,
            vmfb_sha256: hex::encode(Sha256::digest(&vmfb)),
        };
        Artifact { meta, vmfb }
    }

    /// Refuses the artifact unless it was emitted under the numeric contract `expected`
    /// (a descriptor's JSON), naming both.
    pub fn check_contract(&self, expected: &str) -> Result<()> {
        match self.meta.contract.as_deref() {
            Some(found) if found == expected => Ok(()),
            found => Err(Error::ContractMismatch {
                name: self.meta.name.clone(),
                found: found.unwrap_or("none").to_owned(),
                expected: expected.to_owned(),
            }),
        }
    }

    /// Serialises as magic, header length, json header, VMFB.
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.meta).expect("invariant: artifact metadata serialises");
        let mut out = Vec::with_capacity(MAGIC.len() + 8 + header.len() + self.vmfb.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.vmfb);
        out
    }

    /// Parses and verifies an artifact, and refuses one made by another
    /// compiler than `expected_revision`.
    pub fn from_bytes(path: &Path, bytes: &[u8], expected_revision: &str) -> Result<Self> {
        let corrupt = |reason: &str| Error::ArtifactCorrupt { path: path.to_owned(), reason: reason.to_owned() };
        let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(|| corrupt("no mlxcel artifact header"))?;
        if rest.len() < 8 {
            return Err(corrupt("truncated header"));
        }
        let (len, rest) = rest.split_at(8);
        let len = u64::from_le_bytes(len.try_into().expect("invariant: split at 8")) as usize;
        if rest.len() < len {
            return Err(corrupt("truncated header"));
        }
        let (header, vmfb) = rest.split_at(len);
        let meta: ArtifactMeta =
            serde_json::from_slice(header).map_err(|e| corrupt(&format!("unreadable header: {e}")))?;
        if meta.compiler_revision != expected_revision {
            return Err(Error::ArtifactVersion {
                path: path.to_owned(),
                found: meta.compiler_revision,
                wanted: expected_revision.to_owned(),
            });
        }
        if vmfb.len() as u64 != meta.vmfb_len {
            return Err(corrupt(&format!("{} bytes of module, expected {} (truncated)", vmfb.len(), meta.vmfb_len)));
        }
        if hex::encode(Sha256::digest(vmfb)) != meta.vmfb_sha256 {
            return Err(corrupt("module bytes do not match their checksum"));
        }
        Ok(Artifact { meta, vmfb: vmfb.to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn finds_parameter_declarations() {
        let mlir = r#"
  util.global private @w = #flow.parameter.named<"model"::"layers.0.w"> : tensor<4x4xf32>
  util.global private @b = #stream.parameter.named<"model"::"b">: tensor<4xbf16>
  util.global private @c = #flow.parameter.named<"bare"> : tensor<2xi32>
  util.global private @w2 = #flow.parameter.named<"model"::"layers.0.w"> : tensor<4x4xf32>
"#;
        let got = parameter_decls(mlir);
        let want = [
            ("model", "layers.0.w", Some(TensorDesc::new(DType::F32, vec![4, 4]))),
            ("", "bare", Some(TensorDesc::new(DType::I32, vec![2]))),
            ("model", "b", Some(TensorDesc::new(DType::BF16, vec![4]))),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, (scope, key, desc)) in got.iter().zip(want) {
            assert_eq!((g.scope.as_str(), g.key.as_str(), &g.desc), (scope, key, &desc));
        }
    }

    #[test]
    fn artifacts_detect_truncation_and_foreign_compilers() {
        let a = Artifact::new("m", "k", "3.13.0 @ abc", "llvm-cpu:generic", "", vec![1, 2, 3, 4]);
        let bytes = a.to_bytes();
        let p = Path::new("x.vmfb");
        assert_eq!(Artifact::from_bytes(p, &bytes, "3.13.0 @ abc").expect("round trip").vmfb, vec![1, 2, 3, 4]);
        let truncated = Artifact::from_bytes(p, &bytes[..bytes.len() - 1], "3.13.0 @ abc").unwrap_err();
        assert!(matches!(truncated, Error::ArtifactCorrupt { .. }), "{truncated}");
        let foreign = Artifact::from_bytes(p, &bytes, "3.14.0 @ def").unwrap_err();
        assert!(matches!(foreign, Error::ArtifactVersion { .. }), "{foreign}");
        let mut flipped = bytes.clone();
        *flipped.last_mut().expect("non-empty") ^= 1;
        assert!(matches!(Artifact::from_bytes(p, &flipped, "3.13.0 @ abc"), Err(Error::ArtifactCorrupt { .. })));
        assert!(matches!(Artifact::from_bytes(p, b"garbage", "3.13.0 @ abc"), Err(Error::ArtifactCorrupt { .. })));
    }
}
