//! `mlxcel-host serve` on the Qwen2-VL fixture, driven by the official `openai` Python client
//! (tests/server/openai_client.py): golden greedy tokens whole and streamed, a mixed batch equal
//! to each request alone, cancelling mid-stream, bad requests, the capability gate, a full queue
//! and a graceful shutdown. Every family's mixed-batch evidence ([`mixed_batch_gives_the_golden_tokens`])
//! runs through the same harness.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mlxcel_host::text::Tokenizer;
use sha2::Digest;

use crate::support::{experimental_copy, manifest_copy, plugins};

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host is in the workspace")
}

/// The fixture a server serves, its directory name also the served model name.
const FIXTURE: &str = "qwen2_vl";

fn fixture_dir(name: &str) -> PathBuf {
    workspace().join("tests/fixtures").join(name)
}

fn fixture() -> PathBuf {
    fixture_dir(FIXTURE)
}

/// The project venv's Python, which has the `openai` client (tools/dev/setup.sh).
fn python() -> PathBuf {
    let venv = std::env::var_os("MLXCEL_VENV").map_or_else(|| workspace().join(".venv"), PathBuf::from);
    let python = venv.join("bin/python");
    assert!(python.exists(), "{} is missing: source tools/dev/setup.sh", python.display());
    python
}

/// A running server; killed on drop unless it was shut down.
struct Server {
    child: Child,
    base: String,
    /// The fixture served.
    name: String,
    /// Everything the server writes to stderr, once it has exited.
    stderr: std::sync::Mutex<Option<std::thread::JoinHandle<String>>>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::start_with(plugins(), extra)
    }

    fn start_with(plugin_dir: &Path, extra: &[&str]) -> Server {
        Server::serving(FIXTURE, plugin_dir, extra)
    }

    /// A server on `tests/fixtures/<name>` with the plugins of `plugin_dir`.
    fn serving(name: &str, plugin_dir: &Path, extra: &[&str]) -> Server {
        Server::serving_with_env(name, plugin_dir, extra, &[])
    }

    /// As [`Server::serving`], with environment variables set for the server.
    fn serving_with_env(name: &str, plugin_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
            .arg("serve")
            .arg("--model")
            .arg(fixture_dir(name))
            .arg("--plugins")
            .arg(plugin_dir)
            .args(["--port", "0", "--chunk", &crate::support::chunk_for(&fixture_dir(name)).to_string()])
            // 256 rows unless the test asks for another context.
            .args(if extra.contains(&"--context") { &[][..] } else { &["--context", "256"][..] })
            .args(extra)
            .env_remove("MLXCEL_PLUGINS")
            .env_remove("MLXCEL_API_KEY")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let stderr = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        break addr.trim().to_owned();
                    }
                }
                _ => {
                    let _ = child.wait();
                    panic!("the server ended before listening:\n{}", stderr.join().unwrap_or_default());
                }
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server { child, base, name: name.to_owned(), stderr: std::sync::Mutex::new(Some(stderr)) }
    }

    /// Runs one scenario of the client script; its JSON observations.
    fn scenario(&self, name: &str) -> serde_json::Value {
        let output = Command::new(python())
            .arg(workspace().join("host/tests/server/openai_client.py"))
            .arg(name)
            .args(["--server-pid", &self.child.id().to_string()])
            .args(["--base-url", &format!("{}/v1", self.base)])
            .args(["--model", &self.name])
            .arg("--fixture")
            .arg(fixture_dir(&self.name))
            .output()
            .expect("run the openai client");
        if !output.status.success() {
            // Say whether the server was still running, and what it wrote.
            let pid = self.child.id().to_string();
            // A dead child not yet reaped is a zombie, which `kill -0` still finds.
            let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            let server = self.stderr.lock().ok().and_then(|mut h| h.take()).and_then(|h| h.join().ok());
            panic!(
                "scenario {name} failed (server {}):\n{}\n{}\nserver stderr:\n{}",
                if alive { "still running" } else { "exited" },
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                server.unwrap_or_default()
            );
        }
        serde_json::from_slice(&output.stdout).expect("the scenario prints json")
    }

    /// The exit status, once the server has stopped by itself.
    fn wait(&mut self) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "the server did not stop within 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit status and everything the server wrote to stderr.
    fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let status = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().expect("kill");
        assert!(status.success());
        let status = self.wait();
        let stderr = self.stderr.lock().ok().and_then(|mut h| h.take()).and_then(|h| h.join().ok()).unwrap_or_default();
        (status, stderr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn golden_of(name: &str, variant: &str) -> serde_json::Value {
    let path = fixture_dir(name).join("goldens").join(format!("{variant}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden")).expect("json")
}

fn golden(variant: &str) -> serde_json::Value {
    golden_of(FIXTURE, variant)
}

/// The golden greedy tokens of a fixture's variant as the server names them: each token decoded
/// alone, special tokens kept (as `logprobs.content[].token`).
fn golden_token_names(name: &str, variant: &str, tokenizer: &Tokenizer) -> serde_json::Value {
    let names: Vec<String> = golden_of(name, variant)["greedy_tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| tokenizer.decode(&[t.as_u64().expect("id") as u32], false).expect("decode"))
        .collect();
    serde_json::json!(names)
}

/// Eight mixed requests (text and image, greedy and seeded, the fixture's golden image and
/// two-image requests among them), and the golden requests whose image is a JPEG, a WebP or an
/// EXIF-rotated JPEG where the fixture has them, at once through the server and the openai
/// client: each gives what it gives alone, and the golden ones give the golden tokens. A family
/// manifest's `batched` evidence.
pub(crate) fn mixed_batch_gives_the_golden_tokens(name: &str, opt_in: &[&str]) {
    // Qualified capabilities are served without --allow-unqualified.
    let args: Vec<&str> = ["--slots", "4"].iter().chain(opt_in).copied().collect();
    let server = Server::serving(name, plugins(), &args);
    check_mixed_batch(&server);
}

fn check_mixed_batch(server: &Server) {
    let got = server.scenario("concurrent");
    assert_eq!(got["alone"], got["together"]);
    let tokenizer = Tokenizer::load(&fixture_dir(&server.name)).expect("tokenizer");
    let batched = got["goldens_batched"].as_object().expect("golden variants");
    // A family of one image per prompt (no two_images golden) sends its long image variant; a
    // fixture without the PNG image variant, its JPEG one.
    let has = |variant: &str| fixture_dir(&server.name).join(format!("goldens/{variant}.json")).exists();
    let first = ["image", "image_jpeg", "audio"].into_iter().find(|v| has(v)).expect("a media golden");
    let second = ["two_images", "two_audios", "long"].into_iter().find(|v| has(v)).expect("a second media golden");
    for variant in [first, second] {
        assert!(batched.contains_key(variant), "{}: {variant} was not in the batch", server.name);
    }
    // Every golden variant in the batch, the fixture's images sent as JPEG, WebP and
    // EXIF-rotated JPEG among them where it has those (issue 17).
    for (variant, tokens) in batched {
        let golden = golden_token_names(&server.name, variant, &tokenizer);
        assert_eq!(tokens, &golden, "{}: {variant} in a mixed batch: tokens", server.name);
    }
}

/// MLX community checkpoints (affine-quantized 4- and 8-bit, mixed widths) through the server
/// and the openai client: every golden variant gives MLX's greedy tokens, alone and batched.
#[test]
fn mlx_quantized_checkpoints_are_served_with_mlxs_tokens() {
    for name in ["qwen3_mlx_q4", "llama_mlx_mixed"] {
        let server = Server::serving(name, plugins(), &["--slots", "4"]);
        let tokenizer = Tokenizer::load(&fixture_dir(name)).expect("tokenizer");
        let got = server.scenario("text_goldens");
        for variant in ["short", "long"] {
            assert_eq!(got[variant], golden_token_names(name, variant, &tokenizer), "{name}/{variant}");
        }
        let (status, stderr) = server.terminate();
        assert!(status.success(), "{name}: {stderr}");
    }
}

#[test]
fn the_openai_client_gets_the_golden_tokens_batches_cancels_and_bad_requests_are_refused() {
    // Qwen2-VL's image capabilities are qualified: served without --allow-unqualified.
    let server = Server::start(&["--slots", "4", "--max-body-bytes", "2000000"]);
    let tokenizer = Tokenizer::load(&fixture()).expect("tokenizer");

    // Whole and streamed: each golden variant's 16 greedy tokens, token by token.
    let got = server.scenario("golden");
    for variant in ["text_only", "image", "two_images"] {
        let golden = golden(variant);
        let ids: Vec<u32> = golden["greedy_tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect();
        let text = tokenizer.decode(&ids, true).expect("decode");
        assert_eq!(got[variant]["tokens"], golden_token_names(FIXTURE, variant, &tokenizer), "{variant}: tokens");
        assert_eq!(got[variant]["text"], serde_json::json!(text), "{variant}: text");
        assert_eq!(got[variant]["prompt_tokens"], golden["n_prompt_tokens"], "{variant}: prompt tokens");
    }

    // Eight mixed requests at once equal each alone (asserted by the script too), and the two
    // golden image variants among them still give the golden tokens.
    check_mixed_batch(&server);

    // /v1/completions: the text golden's prompt gives its greedy tokens (the script checks text,
    // ids and stream agree); what the endpoint cannot honour is refused naming it.
    let got = server.scenario("completions");
    assert_eq!(got["tokens"], golden_token_names(FIXTURE, "text_only", &tokenizer), "{got}");
    for (case, field) in [("two_prompts", "one prompt"), ("echo", "echo"), ("suffix", "suffix"), ("best_of", "best_of")]
    {
        assert!(got["refused"][case].as_str().unwrap_or_default().contains(field), "{case}: {got}");
    }
    assert!(got["refused"]["unknown_field"].as_str().unwrap_or_default().contains("response_format"), "{got}");

    let got = server.scenario("cancel");
    assert_eq!(got["chunks_read"], 3, "{got}");

    // logit_bias and the fields that change nothing, whole and streamed (the script asserts
    // the tokens); each bad bias is a 400 naming the field.
    let got = server.scenario("client_fields");
    for case in ["bias_out_of_range", "bias_unknown_token", "bias_not_an_id"] {
        assert!(got[case].as_str().unwrap_or_default().contains("logit_bias"), "{case}: {got}");
    }
    assert!(got["detail_unknown"].as_str().unwrap_or_default().contains("image_url.detail `medium`"), "{got}");

    let got = server.scenario("errors");
    let message = got["over_capacity"].as_str().unwrap_or_default();
    assert!(message.contains("exceeds the context capacity of 256"), "{got}");
    assert!(got["oversized_image"].as_str().unwrap_or_default().contains("900000000"), "{got}");
    let audio = got["unsupported_capability"].as_str().unwrap_or_default();
    assert!(audio.contains("capability `audio` is not supported by plugin `qwen2-vl`"), "{got}");
    assert!(got["unsupported_audio_format"].as_str().unwrap_or_default().contains("send the clip as wav"), "{got}");

    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
}

/// Issue 29: `image_url.detail: "low"` is a pixel budget the family's manifest declares, applied
/// through its own resize rule; a family without one serves `low` at its one resolution. The
/// Qwen2-VL fixture's processor bounds images to 12544 pixels, under the in-tree budget (262144),
/// so the server runs a copy of the plugins whose qwen2_vl manifest declares 3136 (the fixture's
/// `min_pixels`): the golden image shrinks from 8 feature tokens to 2. Gemma 3 resizes every
/// image to its tower's size and declares none.
#[test]
fn low_image_detail_is_the_familys_pixel_budget_or_its_one_resolution() {
    let budget = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-plugins-low-detail");
    let _ = std::fs::remove_dir_all(&budget);
    manifest_copy(plugins(), &budget, |manifest| {
        if manifest.plugin.name == "qwen2-vl" {
            manifest.limits.low_detail_max_pixels = Some(3136);
        }
    });
    let server = Server::start_with(&budget, &["--slots", "2"]);
    let got = server.scenario("detail");
    let tokenizer = Tokenizer::load(&fixture()).expect("tokenizer");
    let golden = golden("image");
    // High is the golden, as auto and none are (the script checks they agree).
    assert_eq!(got["high"]["tokens"], golden_token_names(FIXTURE, "image", &tokenizer), "{got}");
    assert_eq!(got["high"]["prompt_tokens"], golden["n_prompt_tokens"], "{got}");
    let n = |detail: &str, key: &str| got[detail][key].as_u64().unwrap_or_else(|| panic!("{detail}.{key}: {got}"));
    assert_eq!(n("low", "prompt_tokens"), n("high", "prompt_tokens") - 6, "8 image tokens become 2: {got}");
    // Its own encoder-cache entry, and its own prefix rows: only the text before the image is
    // kept from the high request before it (one digest for both would keep the image's first
    // two rows too, whose positions agree).
    assert_eq!(got["low"]["encoder_misses"], 1.0, "{got}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).expect("config")).expect("json");
    let before_image = golden["input_ids"].as_array().expect("ids").iter().position(|t| *t == config["image_token_id"]);
    assert_eq!(got["low"]["cached_tokens"].as_u64(), before_image.map(|i| i as u64), "{got}");
    assert!(got["unknown"].as_str().unwrap_or_default().contains("image_url.detail `medium`"), "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");

    let server = Server::serving("gemma3", plugins(), &["--slots", "2"]);
    let got = server.scenario("detail");
    let tokenizer = Tokenizer::load(&fixture_dir("gemma3")).expect("tokenizer");
    assert_eq!(got["high"]["tokens"], golden_token_names("gemma3", "image", &tokenizer), "{got}");
    for key in ["tokens", "prompt_tokens"] {
        assert_eq!(got["low"][key], got["high"][key], "gemma3 serves low at its one resolution: {got}");
    }
    // The same features as high, so the same encoder-cache entry and prefix rows.
    assert_eq!(got["low"]["encoder_misses"], 0.0, "{got}");
    assert_eq!(got["low"]["cached_tokens"].as_u64(), got["low"]["prompt_tokens"].as_u64().map(|n| n - 1), "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
}

/// A conversation about one image, each turn sent twice: with the encoder and prefix caches the
/// repeated image is encoded once and each prompt keeps the rows an earlier one shares, and every
/// answer equals the one a server without either cache gives (token for token).
#[test]
fn a_conversation_reuses_its_image_and_prompt_prefix_and_answers_as_without_the_caches() {
    let server = Server::start(&["--slots", "2"]);
    let warm = server.scenario("conversation");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    let server = Server::start(&["--slots", "2", "--no-prefix-cache", "--encoder-cache-mb", "0"]);
    let cold = server.scenario("conversation");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");

    for turn in ["first", "first_again", "second", "second_again", "other_image"] {
        assert_eq!(warm[turn]["tokens"], cold[turn]["tokens"], "{turn}: the caches changed the answer");
        assert_eq!(cold[turn]["cached_tokens"], 0, "{turn}: {cold}");
        assert_eq!(cold[turn]["encoder_hits"], 0.0, "{turn}: {cold}");
    }
    let n = |turn: &str, key: &str| warm[turn][key].as_u64().unwrap_or_else(|| panic!("{turn}.{key}: {warm}"));
    // The first turn is cold; sent again, it keeps all its rows but the last and encodes nothing.
    assert_eq!((n("first", "cached_tokens"), warm["first"]["encoder_misses"].as_f64()), (0, Some(1.0)), "{warm}");
    assert_eq!(n("first_again", "cached_tokens"), n("first", "prompt_tokens") - 1, "{warm}");
    assert_eq!(warm["first_again"]["encoder_hits"], 1.0, "{warm}");
    // The second turn keeps at least the whole first prompt (its image included); the answer's
    // rows were decoded, which a prefill does not reuse.
    assert!(n("second", "cached_tokens") >= n("first", "prompt_tokens") - 1, "{warm}");
    assert!(n("second", "cached_tokens") < n("second", "prompt_tokens"), "{warm}");
    assert_eq!(warm["second"]["encoder_hits"], 1.0, "{warm}");
    assert_eq!(n("second_again", "cached_tokens"), n("second", "prompt_tokens") - 1, "{warm}");
    // Another image after the same words: a miss, and only the rows before the image kept.
    assert_eq!(warm["other_image"]["encoder_misses"], 1.0, "{warm}");
    assert!(n("other_image", "cached_tokens") < 10, "{warm}");
    let reused: u64 =
        ["first_again", "second", "second_again", "other_image"].iter().map(|t| n(t, "cached_tokens")).sum();
    assert_eq!(warm["prefix_rows_reused"].as_f64(), Some(reused as f64), "{warm}");
}

/// Issue 29: `response_format` through the real client. The script asserts that every answer
/// (several schemas: nested objects, enums, arrays, bounded strings and integers; whole and
/// streamed; greedy and sampled with top-p, top-k and penalties; text and image prompts) ends
/// with `stop`, parses and matches its schema, and is the same inside a batch beside free
/// requests; that `json_object` gives an object and a stop string still cuts the text.
#[test]
fn structured_output_always_parses_and_matches_its_schema_in_every_mode() {
    let server = Server::start(&["--slots", "4"]);
    let got = server.scenario("structured");
    let documents = got["documents"].as_array().expect("documents");
    assert_eq!(documents.len(), 25, "{got}");
    for case in ["bad_ref", "no_name", "ignore_eos"] {
        assert!(got[case].as_str().unwrap_or_default().contains("response_format"), "{case}: {got}");
    }
    assert!(got["unknown_type"].as_str().unwrap_or_default().contains("yaml"), "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
}

/// A copy of `tests/fixtures/<fixture>` under the test target's scratch directory, named `name`:
/// its files copied (but those in `leave_out`), so a test may change them, and its directories
/// (goldens, inputs) linked as they are.
fn fixture_copy(fixture: &str, name: &str, leave_out: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("fixture copy");
    for entry in std::fs::read_dir(fixture_dir(fixture)).expect("fixture").map_while(Result::ok) {
        if entry.path().is_dir() {
            std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).expect("link");
        } else if !leave_out.iter().any(|l| entry.file_name() == **l) {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
        }
    }
    dir
}

/// Issue 29: tool calls through the real client, on the Qwen2.5-VL fixture (whose manifest
/// declares the `hermes` syntax) with a chat template that renders tools
/// (tests/fixtures/tool_templates/hermes). The script asserts forced calls (required, named,
/// one or several, greedy and sampled) come back as `tool_calls` whole and streamed alike, with
/// arguments of their schemas, and go back as a turn; the prompt it reports for a history of
/// calls and results is transformers' rendering, token for token in count.
#[test]
fn tools_are_rendered_and_forced_calls_come_back_as_tool_calls() {
    let dir = fixture_copy("qwen2_5_vl", "qwen2_5_vl_tools", &["chat_template.jinja"]);
    let hermes = workspace().join("tests/fixtures/tool_templates/hermes");
    for name in ["chat_template.jinja", "request.json"] {
        std::fs::copy(hermes.join(name), dir.join(name)).expect("copy");
    }
    let name = dir.to_str().expect("utf-8 path");
    // The history of calls and results is 1,053 tokens of this fixture's small vocabulary.
    let server = Server::serving(name, plugins(), &["--slots", "4", "--context", "2048", "--served-model-name", name]);
    let got = server.scenario("tools");
    let rendered = std::fs::read_to_string(hermes.join("rendered.txt")).expect("rendered");
    let tokenizer = Tokenizer::load(&dir).expect("tokenizer");
    let want = tokenizer.encode(&rendered, false).expect("encode").len();
    assert_eq!(got["history_prompt_tokens"], want, "{got}");
    for case in ["unknown_named", "choice_without_tools"] {
        assert!(got[case].as_str().unwrap_or_default().contains("tool_choice"), "{case}: {got}");
    }
    assert!(got["with_json"].as_str().unwrap_or_default().contains("response_format"), "{got}");
    assert!(got["bad_arguments"].as_str().unwrap_or_default().contains("not JSON"), "{got}");
    assert!(got["tool_without_id"].as_str().unwrap_or_default().contains("tool_call_id"), "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");

    // Qwen2-VL's manifest declares no syntax: calls are refused, `none` only shows the tools.
    let server = Server::start(&["--slots", "2"]);
    let got = server.scenario("tools_undeclared");
    assert!(got["refused"].as_str().unwrap_or_default().contains("tool-call syntax"), "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
}

/// Issue 27: a weight file rewritten under a running server (in place, the same size) is seen
/// before the next request, which is refused with a 503 naming the file; `/ready` fails.
#[test]
fn a_checkpoint_changed_under_the_server_is_refused_never_served() {
    let dir = fixture_copy(FIXTURE, "qwen2_vl_changing", &[]);
    let name = dir.to_str().expect("utf-8 path");
    let server = Server::serving(name, plugins(), &["--slots", "2", "--served-model-name", name]);
    // The scenario asks for the rewrite by creating a marker, and waits for it to go.
    let rewriter = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            let marker = dir.join("rewrite-now");
            for _ in 0..600 {
                if marker.exists() {
                    let weights = dir.join("model.safetensors");
                    let mut bytes = std::fs::read(&weights).expect("read");
                    let last = bytes.len() - 1;
                    bytes[last] ^= 1;
                    std::fs::write(&weights, &bytes).expect("rewrite");
                    std::fs::remove_file(&marker).expect("marker");
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            false
        })
    };
    let got = server.scenario("checkpoint_changed");
    assert!(rewriter.join().expect("rewriter"), "the scenario never asked for the rewrite");
    for case in ["whole", "stream"] {
        let message = got[case].as_str().unwrap_or_default();
        assert!(message.contains("model.safetensors changed on disk") && message.contains("restarted"), "{got}");
    }
    assert_eq!(got["ready"]["status"], "checkpoint_changed", "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("refusing new requests until the server is restarted"), "{stderr}");
}

#[test]
fn shutdown_lets_a_running_stream_finish_and_turns_new_requests_away() {
    let mut server = Server::start(&["--slots", "2"]);
    // The scenario sends SIGTERM itself once its stream has started.
    let got = server.scenario("drain");
    assert_eq!(got["completion_tokens"], 200, "{got}");
    let status = server.wait();
    assert!(status.success());
}

#[test]
fn experimental_capabilities_are_refused_by_default_and_a_full_queue_answers_429() {
    let experimental = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-plugins-experimental");
    let _ = std::fs::remove_dir_all(&experimental);
    experimental_copy(plugins(), &experimental);
    let server = Server::start_with(&experimental, &["--slots", "1", "--queue", "1"]);
    let got = server.scenario("strict");
    assert!(got["unqualified"].as_str().unwrap_or_default().contains("--allow-unqualified"), "{got}");
}

#[test]
fn remote_image_urls_are_fetched_only_when_allowed_and_only_within_the_caps() {
    let server = Server::start(&["--allow-remote-images"]);
    let got = server.scenario("remote_public_only");
    assert!(got["literal"].as_str().unwrap_or_default().contains("127.0.0.1"), "{got}");
    drop(server);

    let server = Server::start(&[
        "--allow-remote-images",
        "--allow-private-image-hosts",
        "--remote-image-max-bytes",
        "200000",
        "--remote-image-timeout",
        "2",
    ]);
    let got = server.scenario("remote");
    assert!(got["/missing"].as_str().unwrap_or_default().contains("HTTP 404"), "{got}");
}

#[test]
fn an_api_key_is_asked_of_every_route_but_health_and_the_openai_client_gets_401_without_it() {
    // The key comes from the environment, as the README recommends.
    let server = Server::serving_with_env(FIXTURE, plugins(), &[], &[("MLXCEL_API_KEY", "sk-mlxcel-test-key")]);
    let got = server.scenario("api_key");
    assert!(got["refused_message"].as_str().unwrap_or_default().contains("Authorization: Bearer"), "{got}");
    assert_eq!(got["whole_tokens"], 3, "{got}");
    assert_eq!(got["whole"], got["streamed"], "{got}");
    assert_eq!(got["models"][0], FIXTURE, "{got}");
    assert_eq!(got["health"], 200, "{got}");
    assert_eq!(got["probes"], serde_json::json!([200, 200]), "/live and /ready need no key: {got}");
    assert_eq!(got["metrics_without_key"], 401, "{got}");
    assert_eq!(got["metrics_with_key"], 200, "{got}");
    assert_eq!(got["unauthorized"], 4.0, "three refused API calls and one /metrics: {got}");
}

#[test]
fn the_gateway_gauges_follow_the_load_and_return_to_zero() {
    let server = Server::start(&["--slots", "2"]);
    let got = server.scenario("gateway_metrics");
    assert_eq!(got["tokens"], serde_json::json!([160, 160, 160, 160, 160, 160]), "{got}");
    assert!(got["busy_scrapes"].as_u64().unwrap_or(0) > 0, "no scrape saw both slots busy and a queue: {got}");
    // Two slots of 256 rows, each holding at most its prompt and 160 tokens.
    let max = got["max_usage"].as_f64().unwrap_or(0.0);
    assert!(max > 0.0 && max <= 1.0, "{got}");
    assert_eq!(
        got["end"],
        serde_json::json!({"mlxcel_queue_depth": 0.0, "mlxcel_active_slots": 0.0, "mlxcel_kv_cache_usage": 0.0}),
        "{got}"
    );
}

/// Clients that disconnect mid-upload, mid-stream, or before sending anything lose nothing for
/// the others: the golden request still gives its tokens, and no request, slot, queue entry or
/// KV row of theirs is held afterwards.
#[test]
fn clients_that_disconnect_mid_upload_or_mid_stream_leave_nothing_behind() {
    let server = Server::start(&["--slots", "2"]);
    let tokenizer = Tokenizer::load(&fixture()).expect("tokenizer");
    let got = server.scenario("disconnects");
    assert_eq!(got["streams_read"], serde_json::json!([2, 2, 2, 2]), "{got}");
    assert_eq!(got["golden_tokens"], golden_token_names("qwen2_vl", "image", &tokenizer), "{got}");
    assert_eq!(
        got["end"],
        serde_json::json!({"mlxcel_requests_open": 0.0, "mlxcel_active_slots": 0.0, "mlxcel_queue_depth": 0.0,
                           "mlxcel_kv_cache_usage": 0.0}),
        "{got}"
    );
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
}

/// A plugin directory holding only `testkit-faulty` (plugins/testkit/faulty: the Qwen2-VL family
/// misbehaving on images of chosen widths), its manifest the built Qwen2-VL one renamed and
/// stamped with the fixture library's hash.
fn faulty_plugins(out: &Path) {
    let package = "mlxcel-testkit-faulty";
    let file = crate::support::library_file(package);
    let built = crate::support::build_packages(&[package]).join(&file);
    std::fs::create_dir_all(out).expect("plugin dir");
    let library = out.join(&file);
    std::fs::copy(&built, &library).expect("copy the library");
    let mut manifest = mlxcel_plugin_api::Manifest::from_file(&plugins().join("qwen2_vl.toml")).expect("manifest");
    manifest.plugin.name = "testkit-faulty".to_owned();
    manifest.plugin.library = file;
    let bytes = std::fs::read(&library).expect("read the library");
    manifest.plugin.sha256 = hex::encode(sha2::Sha256::digest(&bytes));
    std::fs::write(out.join("testkit-faulty.toml"), manifest.to_toml()).expect("write the manifest");
}

/// A plugin at fault, through the server beside a running stream and the golden request: its
/// panic, NaN pixel values and a tensor short of its shape are 500s naming the plugin; a call
/// stuck past `--prepare-deadline` is a 500 at the deadline, counted overdue (so `/ready` fails
/// while the one worker is stuck) and uncounted when it returns, its media held meanwhile (so
/// `--max-media-mb` refuses what does not fit beside it with a 429, and media over the whole
/// budget with a 413); the stream ends whole, the golden image request gives its tokens, and
/// nothing is left held.
#[test]
fn a_plugin_that_panics_stalls_or_returns_malformed_tensors_costs_only_its_own_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    faulty_plugins(dir.path());
    let limits = ["--prepare-workers", "1", "--prepare-deadline", "2", "--max-media-mb", "0.01"];
    let args: Vec<&str> = ["--slots", "2"].iter().chain(&limits).copied().collect();
    let server = Server::start_with(dir.path(), &args);
    let tokenizer = Tokenizer::load(&fixture()).expect("tokenizer");
    let got = server.scenario("plugin_faults");
    let message = |case: &str| got[case].as_str().unwrap_or_default().to_owned();
    assert!(message("panic").contains("plugin `testkit-faulty` failed in preprocess"), "{got}");
    assert!(message("panic").contains("panicked"), "{got}");
    assert!(message("nan").contains("answered preprocess with a malformed result"), "{got}");
    assert!(message("nan").contains("not finite at flat index 0"), "{got}");
    // The plugin-api's own glue checks a tensor's length before it leaves the plugin; the host
    // checks again for plugins built otherwise.
    assert!(message("short").contains("plugin `testkit-faulty` failed in preprocess"), "{got}");
    assert!(message("short").contains("bytes but f32") && message("short").contains("needs"), "{got}");
    assert!(message("stall").contains("did not finish within 2 s"), "{got}");
    // Given up at the deadline, not when the stuck call returned (6 s).
    let stalled = got["stall_seconds"].as_f64().unwrap_or_default();
    assert!((1.9..5.0).contains(&stalled), "{got}");
    assert_eq!(got["overdue_after_deadline"], 1.0, "{got}");
    assert_eq!(got["ready_while_overdue"][0], 503, "{got}");
    assert_eq!(got["ready_while_overdue"][1]["status"], "preparations_overdue", "{got}");
    // The stalled request's file is held until its thread returns; nothing else is held then.
    assert_eq!(got["held_after_deadline"][0], got["held_after_deadline"][1], "{got}");
    assert!(message("beside_the_stalled").contains("does not fit beside the"), "{got}");
    assert!(message("over_the_budget").contains("is more than the server holds for all requests"), "{got}");
    assert_eq!(got["golden_tokens"], golden_token_names(FIXTURE, "image", &tokenizer), "{got}");
    assert_eq!(got["stream"], serde_json::json!([120, "length"]), "{got}");
    assert_eq!(
        got["end"],
        serde_json::json!({"mlxcel_requests_open": 0.0, "mlxcel_active_slots": 0.0, "mlxcel_queue_depth": 0.0,
                           "mlxcel_kv_cache_usage": 0.0, "mlxcel_preparations_overdue": 0.0,
                           "mlxcel_media_bytes_held": 0.0}),
        "{got}"
    );
    assert_eq!(got["ready_at_end"][0], 200, "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("passed its deadline; given up"), "{stderr}");
    assert!(stderr.contains("a preparation given up at its deadline has returned"), "{stderr}");
}

/// A compile cache built ahead with `mlxcel-host compile` serves a server that only reads it
/// (it warms every encoder bucket before listening and answers with the golden tokens) and is
/// left as it was; a shape it was not built for fails at start, saying how to build it.
#[test]
fn a_compile_cache_built_ahead_serves_a_read_only_server() {
    let cache = tempfile::tempdir().expect("tempdir");
    let cache_dir = cache.path().to_str().expect("utf-8 path");
    let chunk = crate::support::chunk_for(&fixture()).to_string();
    let shape = ["--context", "256", "--chunk", chunk.as_str()];
    let compiled = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["compile", "--model"])
        .arg(fixture())
        .arg("--plugins")
        .arg(plugins())
        .args(shape)
        .args(["--cache-dir", cache_dir])
        .env_remove("MLXCEL_CACHE_READ_ONLY")
        .output()
        .expect("run compile");
    let stderr = String::from_utf8_lossy(&compiled.stderr);
    assert!(compiled.status.success(), "{stderr}");
    assert!(stderr.contains("encoders ready:"), "{stderr}");
    let entries = || {
        let mut names: Vec<String> = std::fs::read_dir(cache.path())
            .expect("cache dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let built = entries();
    assert!(built.len() >= 2, "the decoder bundle and the encoder buckets: {built:?}");

    let read_only = ["--cache-dir", cache_dir, "--compile-cache-read-only", "--warm-encoders"];
    let server = Server::start(&read_only);
    let tokenizer = Tokenizer::load(&fixture()).expect("tokenizer");
    let got = server.scenario("golden");
    assert_eq!(got["image"]["tokens"], golden_token_names(FIXTURE, "image", &tokenizer), "{got}");
    let (status, stderr) = server.terminate();
    assert!(status.success(), "{stderr}");
    assert_eq!(entries(), built, "a read-only cache is never written");

    // Another context: the bundle was not built for it.
    let refused = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["serve", "--model"])
        .arg(fixture())
        .arg("--plugins")
        .arg(plugins())
        .args(["--port", "0", "--context", "128", "--chunk", chunk.as_str()])
        .args(read_only)
        .output()
        .expect("run serve");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("read-only") && stderr.contains("mlxcel-host compile"), "{stderr}");
    assert_eq!(entries(), built);
}
