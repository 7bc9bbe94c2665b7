//! `deploy/`: the container definition and the Kubernetes manifests parse, and agree with each
//! other and with the binary: every flag they pass exists, the compile Job builds the cache for
//! the shape the servers ask for, the probes and ports match the routes the server serves.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn deploy_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy"))
}

/// Every document of every `.yaml` under deploy/, as JSON values.
fn manifests() -> Vec<Value> {
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(deploy_dir()).expect("deploy/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("read");
            for doc in serde_norway::Deserializer::from_str(&text) {
                let value: Value = serde::Deserialize::deserialize(doc)
                    .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
                docs.push(value);
            }
        }
    }
    docs
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in deploy/"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect()
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// Every `--flag` of `args` is one the subcommand (`args[0]`) takes.
fn flags_exist(args: &[String]) {
    let help = Command::new(env!("CARGO_BIN_EXE_mlxcel-host")).args([&args[0], "--help"]).output().expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    for a in args.iter().filter(|a| a.starts_with("--")) {
        assert!(help.contains(&format!("{a} ")) || help.contains(&format!("{a}\n")), "{} takes no {a}", args[0]);
    }
}

#[test]
fn the_manifests_agree_with_each_other_and_with_the_binary() {
    let docs = manifests();
    let job = &kind(&docs, "Job")["spec"]["template"]["spec"];
    let deployment = &kind(&docs, "Deployment")["spec"]["template"]["spec"];
    let compile = strings(&job["containers"][0]["args"]);
    let serve = strings(&deployment["containers"][0]["args"]);
    assert_eq!((compile[0].as_str(), serve[0].as_str()), ("compile", "serve"));
    flags_exist(&compile);
    flags_exist(&serve);
    // The cache the Job builds is the one the servers read: same model, shape, target, directory.
    for f in ["--model", "--slots", "--context", "--chunk", "--target-cpu", "--cache-dir", "--compute"] {
        assert_eq!(flag(&compile, f), flag(&serve, f), "{f} differs between the compile Job and the servers");
    }
    assert!(serve.iter().any(|a| a == "--compile-cache-read-only"), "the servers only read the cache");
    assert!(serve.iter().any(|a| a == "--warm-encoders"), "a missing encoder fails at start, not at an image");
    let mounts = &deployment["containers"][0]["volumeMounts"];
    let cache_mount = mounts
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| Some(m["mountPath"].as_str().unwrap_or_default()) == flag(&serve, "--cache-dir"))
        .expect("the cache directory is a mounted volume");
    assert_eq!(cache_mount["readOnly"], true);

    // Probes on the routes the server has, on the port it listens on, which the Service and the
    // InferencePool target.
    let container = &deployment["containers"][0];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/live");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/ready");
    let port: u64 = flag(&serve, "--port").expect("--port").parse().expect("a number");
    assert_eq!(container["ports"][0]["containerPort"], port);
    assert_eq!(kind(&docs, "Service")["spec"]["ports"][0]["targetPort"], port);
    let pool = &kind(&docs, "InferencePool")["spec"];
    assert_eq!(pool["targetPorts"][0]["number"], port);
    let labels = &kind(&docs, "Deployment")["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&pool["selector"]["matchLabels"], labels, "the pool selects the servers");
    assert_eq!(&kind(&docs, "Service")["spec"]["selector"], labels);
    for spec in [job, deployment] {
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    }
}

#[test]
fn the_container_is_built_in_stages_and_runs_as_a_user() {
    let text = std::fs::read_to_string(deploy_dir().join("Containerfile")).expect("Containerfile");
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    assert!(lines.iter().filter(|l| l.starts_with("FROM ")).count() >= 2, "a build stage and a runtime stage");
    let user = lines.iter().rev().find(|l| l.starts_with("USER ")).expect("a USER line");
    assert!(!matches!(user.trim_start_matches("USER ").trim(), "root" | "0"), "{user}");
    for needed in ["MLXCEL_IREE_COMPILER", "MLXCEL_PLUGINS", "tools/build-plugins.sh", "tools/dev/setup.sh"] {
        assert!(text.contains(needed), "the container sets up {needed}");
    }
}
