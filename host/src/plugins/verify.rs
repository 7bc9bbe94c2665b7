//! `plugins verify`: the conformance kit. Loads a plugin, then checks its answers against a
//! fixture's goldens (the oracle's layout, `tools/oracle/README.md`) stage by stage:
//!
//! - `config`: the manifest accepts the checkpoint and `parse_config` reads it;
//! - `checkpoint`: `check_checkpoint` finds nothing missing (plugin-api 1.1 and later);
//! - per variant, `preprocess` (the items' tensors, concatenated along the first axis, against
//!   the goldens of the same name), `placeholder` (the expanded prompt against the golden
//!   `input_ids`, token by token), `encoder` (the plugin's StableHLO compiled and run by the
//!   host's stack on the fixture checkpoint against `image_features` / `audio_features`),
//!   `positions` and `mask` (the prefill contract for the golden `input_ids` against
//!   `position_ids` and `attention_mask.full_attention`), then the decoder:
//!   `embeddings` (the prefill input built as `generate` and `serve` build it, text embeddings
//!   merged with the encoder rows where the contract places them, against `inputs_embeds`),
//!   `logits` (the checkpoint's decoder prefilled from those embeddings at the contract's
//!   positions, against `logits`, then fed the golden greedy tokens one by one so each step
//!   stays comparable after a divergence, against `decode_logits`) and `tokens` (the argmax of
//!   each of those steps against `greedy_tokens`). Variants without media take the same path
//!   with no placements.
//!
//! Stages the goldens do not cover are skipped and say so. Comparisons go through
//! `mlxcel_golden`, so a failure names the first divergent coordinate; the tolerances are the
//! published ones (`mlxcel_plugin_api::conformance::tolerance`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlxcel_golden::{Fixture, Golden, Report, Tolerance};
use mlxcel_host::decoder::{BundleShape, Decoder, DecoderOptions, Logits};
use mlxcel_plugin_api::conformance::tolerance;
use mlxcel_plugin_api::{
    ContractRequest, DType, ItemMeta, LayoutRequest, LoadedPlugin, Manifest, Modality, ModelConfig, PluginSet,
    Positions, PrefillProgram, Preprocessed, RVec, Tensor, load_plugin, scan,
};
use mlxcel_shim::{CacheOutcome, Checkpoint, Compiler, Device, Driver, Target};

use super::tokens::Pieces;
use crate::exec::{Compute, DeviceArgs};
use crate::multimodal::{Encoders, contract_input, decoder_spec, plugin_index, preprocess, processor_json, read_text};
use mlxcel_decoder::DecoderSpec;

/// The unit of the decoder bundle's prefill chunk (see [`Kit::decoder_chunk`]).
const CHUNK: usize = 32;
/// Greedy steps checked when a golden does not say (the oracle records 16).
const GREEDY_STEPS: usize = 16;

#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// The plugin: a plugin directory (the plugin that accepts the fixture's checkpoint is
    /// checked), a manifest (`.toml`), or a library next to its manifest.
    plugin: PathBuf,
    /// The fixture: a checkpoint with `inputs/` and `goldens/`, as `tests/fixtures/<name>`.
    #[arg(long, value_name = "DIR")]
    fixture: PathBuf,
    /// Check only this variant (repeatable) [default: every variant in `goldens/`].
    #[arg(long = "variant", value_name = "NAME")]
    variants: Vec<String>,
    /// Print the report as one JSON object on stdout (the lines go to stderr): every stage of
    /// every variant with its outcome, difference and tolerance, what conformance tests read.
    #[arg(long)]
    json: bool,
    /// What the encoders and the decoder compute in. Under bf16 (experimental, with
    /// --allow-unqualified) every numeric stage is held to the reference bit for bit: a bf16
    /// fixture's reference runs in bf16.
    #[arg(long, value_enum, default_value = "f32")]
    compute: Compute,
    /// Allow an experimental compute.
    #[arg(long)]
    allow_unqualified: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

/// How one stage went.
#[derive(Debug)]
enum Outcome {
    /// A check without numbers (the config parses, the checkpoint has every tensor).
    Checked(String),
    Passed {
        max_abs_diff: f64,
        tolerance: f64,
        detail: String,
    },
    Failed(String),
    Skipped(String),
}

#[derive(Debug)]
struct Stage {
    name: &'static str,
    outcome: Outcome,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Outcome::Checked(detail) => write!(f, "{:<12} ok       {detail}", self.name),
            Outcome::Passed { max_abs_diff, tolerance, detail } if *tolerance == 0.0 && *max_abs_diff == 0.0 => {
                write!(f, "{:<12} ok       exact", self.name)?;
                if !detail.is_empty() {
                    write!(f, "; {detail}")?;
                }
                Ok(())
            }
            Outcome::Passed { max_abs_diff, tolerance, detail } => {
                write!(f, "{:<12} ok       max-abs-diff {max_abs_diff:.3e} (tolerance {tolerance:e})", self.name)?;
                if !detail.is_empty() {
                    write!(f, "; {detail}")?;
                }
                Ok(())
            }
            Outcome::Failed(why) => write!(f, "{:<12} FAILED   {why}", self.name),
            Outcome::Skipped(why) => write!(f, "{:<12} skipped  {why}", self.name),
        }
    }
}

fn stage(name: &'static str, outcome: Outcome) -> Stage {
    Stage { name, outcome }
}

impl Stage {
    /// The stage as `--json` reports it.
    fn json(&self, variant: &str) -> serde_json::Value {
        let (outcome, max_abs_diff, tolerance, detail) = match &self.outcome {
            Outcome::Checked(detail) => ("checked", None, None, detail.as_str()),
            Outcome::Passed { max_abs_diff, tolerance, detail } => {
                ("passed", Some(*max_abs_diff), Some(*tolerance), detail.as_str())
            }
            Outcome::Failed(why) => ("failed", None, None, why.as_str()),
            Outcome::Skipped(why) => ("skipped", None, None, why.as_str()),
        };
        serde_json::json!({
            "variant": variant, "stage": self.name, "outcome": outcome,
            "max_abs_diff": max_abs_diff, "tolerance": tolerance, "detail": detail,
        })
    }
}

/// A golden comparison as an outcome.
fn compared(result: Result<Report, mlxcel_golden::Error>, detail: String) -> Outcome {
    match result {
        Ok(report) => Outcome::Passed { max_abs_diff: report.max_abs_diff, tolerance: report.tolerance.abs, detail },
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

pub(crate) fn run(args: &VerifyArgs) -> Result<()> {
    // With --json the human report goes to stderr and stdout holds only the JSON object.
    let json = args.json;
    macro_rules! println {
        ($($arg:tt)*) => {
            if json { eprintln!($($arg)*) } else { std::println!($($arg)*) }
        };
    }
    let fixture = Fixture::open(&args.fixture);
    let dir = fixture.dir();
    let config_json = read_text(&dir.join("config.json"))?;
    let processor_json = processor_json(dir)?;
    let source = PluginSource::open(&args.plugin)?;
    let plugin = source.plugin(&config_json)?;
    println!(
        "plugin {} {} (plugin-api {}) from {}",
        plugin.name(),
        plugin.manifest().plugin.version,
        plugin.api_version(),
        plugin.manifest_path().display()
    );
    println!("fixture {}", dir.display());

    let variants = if args.variants.is_empty() { fixture.variants()? } else { args.variants.clone() };
    if variants.is_empty() {
        bail!("{} has no goldens (goldens/<variant>.safetensors)", dir.display());
    }
    let goldens = variants.iter().map(|v| fixture.golden(v)).collect::<Result<Vec<Golden>, _>>()?;

    let (config_stage, config) = parse_config(plugin, &config_json, &processor_json);
    println!("  {config_stage}");
    let Some(config) = config else {
        bail!("verify failed at stage config: {}", failure_text(&config_stage));
    };
    let contract = args.compute.contract(args.allow_unqualified, &args.device.target_cpu)?;
    let mut kit = Kit::new(plugin, &fixture, config, &args.device, contract);
    kit.chunk = kit.decoder_chunk(&goldens);
    kit.capacity = capacity(&goldens, kit.chunk);
    let mut results: Vec<(String, Stage)> = vec![("(fixture)".to_owned(), config_stage)];
    let checkpoint_stage = kit.checkpoint_stage();
    println!("  {checkpoint_stage}");
    results.push(("(fixture)".to_owned(), checkpoint_stage));

    for (variant, golden) in variants.iter().zip(&goldens) {
        println!("variant {variant}:");
        for stage in kit.variant(golden) {
            println!("  {stage}");
            results.push((variant.clone(), stage));
        }
    }

    let failures: Vec<&(String, Stage)> =
        results.iter().filter(|(_, s)| matches!(s.outcome, Outcome::Failed(_))).collect();
    if json {
        let report = serde_json::json!({
            "plugin": plugin.name(),
            "plugin_version": plugin.manifest().plugin.version,
            "plugin_api": plugin.api_version().to_string(),
            "fixture": dir.display().to_string(),
            "passed": failures.is_empty(),
            "variants": variants,
            "stages": results.iter().map(|(variant, s)| s.json(variant)).collect::<Vec<_>>(),
            "greedy": kit.greedy.iter().map(|(variant, matched, total)| {
                (variant.clone(), serde_json::json!({"matched": matched, "total": total}))
            }).collect::<serde_json::Map<_, _>>(),
        });
        std::println!("{report}");
    }
    if let Some((variant, first)) = failures.first() {
        bail!(
            "verify failed: {} stage(s) failed; the first is variant {variant}, stage {}: {}",
            failures.len(),
            first.name,
            failure_text(first)
        );
    }
    let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
    for (_, s) in &results {
        if let Outcome::Passed { max_abs_diff, .. } = s.outcome
            && mlxcel_plugin_api::manifest::STAGES.contains(&s.name)
        {
            let entry = worst.entry(s.name).or_insert(0.0);
            *entry = entry.max(max_abs_diff);
        }
    }
    println!("verify: passed ({} variants)", variants.len());
    println!("max-abs-diff per stage, for the manifest's evidence:");
    for (name, diff) in worst {
        println!("  {name} = {diff:e}");
    }
    if !kit.greedy.is_empty() {
        println!("greedy tokens matched per variant, for the manifest's evidence:");
        for (variant, matched, total) in &kit.greedy {
            println!("  {variant} = {matched}/{total}");
        }
    }
    Ok(())
}

/// The smallest multiple of [`CHUNK`] (at least one) that holds a block of `rows`.
fn chunk_holding(rows: usize) -> usize {
    rows.div_ceil(CHUNK).max(1) * CHUNK
}

/// A context capacity for every variant's prompt and its greedy steps, in whole chunks, so one
/// bundle serves the whole run.
fn capacity(goldens: &[Golden], chunk: usize) -> usize {
    let rows = goldens
        .iter()
        .map(|g| {
            let prompt = g.tensor("input_ids").map_or(0, |t| t.len());
            let steps = g.tensor("greedy_tokens").map_or(GREEDY_STEPS, |t| t.len());
            prompt + steps
        })
        .max()
        .unwrap_or(0);
    rows.div_ceil(chunk).max(1) * chunk
}

fn failure_text(stage: &Stage) -> &str {
    match &stage.outcome {
        Outcome::Failed(why) => why,
        _ => "",
    }
}

/// The plugin under test, as the user named it.
enum PluginSource {
    Dir(PathBuf, PluginSet),
    One(Box<LoadedPlugin>),
}

impl PluginSource {
    fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let set = scan(path)?;
            for rejection in set.rejected() {
                eprintln!("note: {rejection}");
            }
            return Ok(Self::Dir(path.to_owned(), set));
        }
        let manifest =
            if path.extension().is_some_and(|e| e == "toml") { path.to_owned() } else { manifest_naming(path)? };
        let plugin =
            load_plugin(&manifest).with_context(|| format!("cannot load the plugin {}", manifest.display()))?;
        Ok(Self::One(Box::new(plugin)))
    }

    fn plugin(&self, config_json: &str) -> Result<&LoadedPlugin> {
        match self {
            Self::Dir(dir, set) => set
                .for_config(config_json)
                .with_context(|| format!("no plugin in {} accepts the fixture's checkpoint", dir.display())),
            Self::One(plugin) => Ok(plugin),
        }
    }
}

/// The manifest beside `library` that names it.
fn manifest_naming(library: &Path) -> Result<PathBuf> {
    let file = library.file_name().and_then(|f| f.to_str()).context("the plugin path has no file name")?;
    let dir = library.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let path = entry.with_context(|| format!("cannot list {}", dir.display()))?.path();
        if path.extension().is_some_and(|e| e == "toml")
            && Manifest::from_file(&path).is_ok_and(|m| m.plugin.library == file)
        {
            return Ok(path);
        }
    }
    bail!("no valid manifest in {} names the library {file}", dir.display())
}

/// The `config` stage: the manifest accepts the checkpoint, and `parse_config` reads it.
fn parse_config(plugin: &LoadedPlugin, config_json: &str, processor_json: &str) -> (Stage, Option<ModelConfig>) {
    let value: serde_json::Value = serde_json::from_str(config_json).unwrap_or_default();
    let architecture = value.pointer("/architectures/0").and_then(|a| a.as_str()).unwrap_or_default();
    let model_type = value.get("model_type").and_then(|m| m.as_str()).unwrap_or_default();
    let accepts = &plugin.manifest().accepts;
    if !accepts.architectures.iter().any(|a| a == architecture) && !accepts.model_types.iter().any(|m| m == model_type)
    {
        let why = format!(
            "the manifest accepts neither architecture `{architecture}` nor model_type `{model_type}` of the fixture"
        );
        return (stage("config", Outcome::Failed(why)), None);
    }
    match plugin.parse_config(config_json, processor_json) {
        Ok(config) => {
            let detail = format!("{architecture} ({model_type})");
            (stage("config", Outcome::Checked(detail)), Some(config))
        }
        Err(e) => (stage("config", Outcome::Failed(e.to_string())), None),
    }
}

/// One media item of a variant.
struct Media {
    path: PathBuf,
    modality: Modality,
    bytes: Vec<u8>,
}

struct Kit<'a> {
    plugin: &'a LoadedPlugin,
    fixture: &'a Fixture,
    config: ModelConfig,
    device_args: &'a DeviceArgs,
    encoders: Encoders<'a>,
    pieces: Option<Result<Pieces, String>>,
    /// The checkpoint's decoder, compiled on first use and kept for every variant.
    decoder: Option<Result<Decoder, String>>,
    /// The decoder's prefill chunk.
    chunk: usize,
    /// The decoder's context capacity.
    capacity: usize,
    /// Per variant whose `tokens` stage ran: greedy tokens matched and compared.
    greedy: Vec<(String, usize, usize)>,
    /// The decoder's and encoders' contract when not f32.
    contract: Option<mlxcel_emit::NumericContract>,
}

/// The prefill and teacher-forced decode of one variant.
struct Trajectory {
    /// The merged prefill embeddings, `[n, hidden]`.
    embeddings: Vec<f32>,
    /// The prefill's logits, `[n, vocab]`.
    prefill: Vec<f32>,
    vocab: usize,
    /// Logits each greedy token is picked from: the prefill's last row, then one per decode
    /// step fed the golden's previous token.
    steps: Vec<Vec<f32>>,
}

/// Where a trajectory stopped, and the stage it fails.
enum Stopped {
    /// Before the prefill: the decoder or the merged embeddings.
    Embeddings(String),
    /// In the prefill or a decode step, after the embeddings were built.
    Logits(Vec<f32>, String),
}

impl<'a> Kit<'a> {
    fn new(
        plugin: &'a LoadedPlugin,
        fixture: &'a Fixture,
        config: ModelConfig,
        device_args: &'a DeviceArgs,
        contract: Option<mlxcel_emit::NumericContract>,
    ) -> Self {
        let encoders = Encoders::new(fixture.dir(), device_args, contract.as_ref());
        Self {
            plugin,
            fixture,
            config,
            device_args,
            encoders,
            pieces: None,
            decoder: None,
            chunk: CHUNK,
            capacity: CHUNK,
            greedy: Vec::new(),
            contract,
        }
    }

    /// A numeric stage's tolerance: the qualified one in f32, none under another compute,
    /// whose reference runs in that compute too.
    fn tolerance(&self, stage: &str) -> f64 {
        if self.contract.is_some() { 0.0 } else { tolerance(stage) }
    }

    /// The prefill chunk for the decoder: the smallest multiple of [`CHUNK`] that holds the
    /// largest bidirectional block of any variant's contract. The decoder prefills a block's
    /// rows in one call (they must see each other) and refuses a block longer than its chunk, so
    /// a fixed 32 would fail a family whose image blocks are longer (256 soft tokens per image
    /// in one hub checkpoint) at the logits stage for the kit's reason, not the
    /// plugin's. Variants whose media or contract fail here are left to their own stages.
    fn decoder_chunk(&self, goldens: &[Golden]) -> usize {
        let mut largest = 0usize;
        for golden in goldens {
            let Ok(media) = self.media(golden) else { continue };
            let Ok(items) = media.iter().map(|m| self.preprocess(m)).collect::<Result<Vec<_>>>() else { continue };
            let metas: Vec<ItemMeta> = media
                .iter()
                .zip(&items)
                .map(|(m, p)| ItemMeta { modality: m.modality, grid: p.grid.clone() })
                .collect();
            if let Ok(contract) = self.contract(golden, &metas) {
                // A block's rows and columns are prefilled in one call: from the first to the last.
                for b in contract.mask.blocks.iter().filter(|b| b.allow) {
                    let start = b.row_start.min(b.col_start);
                    let end = (b.row_start + b.rows).max(b.col_start + b.cols);
                    largest = largest.max((end - start) as usize);
                }
            }
        }
        chunk_holding(largest)
    }

    /// `check_checkpoint` over the fixture's tensor index.
    fn checkpoint_stage(&self) -> Stage {
        let checkpoint = match Checkpoint::open(self.fixture.dir()) {
            Ok(c) => c,
            Err(e) => return stage("checkpoint", Outcome::Failed(e.to_string())),
        };
        let index = plugin_index(&checkpoint);
        let count = index.tensors.len();
        let outcome = match self.plugin.check_checkpoint(&self.config, &index) {
            Ok(None) => Outcome::Skipped("the plugin predates plugin-api 1.1 (no check_checkpoint)".to_owned()),
            Ok(Some(report)) if report.problems.is_empty() => {
                Outcome::Checked(format!("no problems among the {count} checkpoint tensors"))
            }
            Ok(Some(report)) => {
                Outcome::Failed(report.problems.iter().map(|p| p.as_str()).collect::<Vec<_>>().join("; "))
            }
            Err(e) => Outcome::Failed(e.to_string()),
        };
        stage("checkpoint", outcome)
    }

    /// Every per-variant stage, in pipeline order.
    fn variant(&mut self, golden: &Golden) -> Vec<Stage> {
        let media = match self.media(golden) {
            Ok(media) => media,
            Err(e) => return vec![stage("preprocess", Outcome::Failed(format!("{e:#}")))],
        };
        let mut stages = Vec::new();

        let mut items: Vec<Preprocessed> = Vec::new();
        let mut preprocess_error = None;
        for item in &media {
            match self.preprocess(item) {
                Ok(p) => items.push(p),
                Err(e) => {
                    preprocess_error = Some(format!("{}: {e:#}", item.path.display()));
                    break;
                }
            }
        }
        let preprocessed = preprocess_error.is_none();
        stages.push(stage(
            "preprocess",
            match preprocess_error {
                Some(e) => Outcome::Failed(e),
                None if media.is_empty() => Outcome::Skipped("no media in this variant".to_owned()),
                None => compare_preprocess(golden, &items),
            },
        ));
        let metas: Vec<ItemMeta> =
            media.iter().zip(&items).map(|(m, p)| ItemMeta { modality: m.modality, grid: p.grid.clone() }).collect();

        let needs_preprocess = || Outcome::Skipped("needs the preprocess stage's grids".to_owned());
        stages.push(stage(
            "placeholder",
            if preprocessed { self.placeholder(golden, &metas) } else { needs_preprocess() },
        ));

        let contract = if preprocessed { Some(self.contract(golden, &metas)) } else { None };
        let placed = contract.as_ref().and_then(|c| c.as_ref().ok());
        stages.push(stage(
            "encoder",
            if !preprocessed {
                needs_preprocess()
            } else if media.is_empty() {
                Outcome::Skipped("no media in this variant".to_owned())
            } else {
                self.encoder(golden, &media, &items, placed)
            },
        ));

        let (positions, mask) = match &contract {
            None => (needs_preprocess(), needs_preprocess()),
            Some(Err(e)) => (Outcome::Failed(e.clone()), Outcome::Failed(e.clone())),
            Some(Ok(contract)) => (compare_positions(golden, contract), compare_mask(golden, contract)),
        };
        stages.push(stage("positions", positions));
        stages.push(stage("mask", mask));
        stages.extend(self.decoder_stages(golden, &media, &items, contract.as_ref()));
        stages
    }

    /// `embeddings`, `logits` and `tokens`: the golden prompt through the checkpoint's decoder
    /// as `generate` and `serve` prefill it, then the golden greedy tokens fed back one by one.
    fn decoder_stages(
        &mut self,
        golden: &Golden,
        media: &[Media],
        items: &[Preprocessed],
        contract: Option<&Result<PrefillProgram, String>>,
    ) -> Vec<Stage> {
        let missing = |key: &str| Outcome::Skipped(format!("the goldens have no `{key}`"));
        let no_logits = || Outcome::Skipped("the goldens have neither `logits` nor `decode_logits`".to_owned());
        let has_logits = golden.has("logits") || golden.has("decode_logits");
        let has_tokens = golden.has("greedy_tokens");
        if !golden.has("inputs_embeds") && !has_logits && !has_tokens {
            return vec![
                stage("embeddings", missing("inputs_embeds")),
                stage("logits", no_logits()),
                stage("tokens", missing("greedy_tokens")),
            ];
        }
        let all = |why: &str| {
            ["embeddings", "logits", "tokens"].map(|name| stage(name, Outcome::Skipped(why.to_owned()))).into()
        };
        let contract = match contract {
            None => return all("needs the preprocess stage's grids"),
            Some(Err(_)) => return all("needs the prefill contract, which failed above"),
            Some(Ok(contract)) => contract,
        };
        let greedy = golden.greedy_tokens().ok();
        let steps = greedy.as_ref().map_or(1, Vec::len);
        let trajectory = match self.trajectory(golden, media, items, contract, greedy.as_deref(), steps) {
            Ok(trajectory) => trajectory,
            Err(Stopped::Embeddings(why)) => {
                return vec![
                    stage("embeddings", Outcome::Failed(why)),
                    stage("logits", Outcome::Skipped("needs the merged embeddings".to_owned())),
                    stage("tokens", Outcome::Skipped("needs the merged embeddings".to_owned())),
                ];
            }
            Err(Stopped::Logits(embeddings, why)) => {
                return vec![
                    stage("embeddings", compare_embeddings(golden, &embeddings, self.tolerance("embeddings"))),
                    stage("logits", Outcome::Failed(why)),
                    stage("tokens", Outcome::Skipped("needs the logits".to_owned())),
                ];
            }
        };

        let logits = if has_logits {
            compare_logits(golden, &trajectory, greedy.is_some(), self.tolerance("logits"))
        } else {
            no_logits()
        };
        let tokens = match &greedy {
            None => missing("greedy_tokens"),
            Some(want) => {
                let (matched, outcome) = compare_tokens(want, &trajectory.steps);
                self.greedy.push((golden.variant().to_owned(), matched, want.len()));
                outcome
            }
        };
        vec![
            stage("embeddings", compare_embeddings(golden, &trajectory.embeddings, self.tolerance("embeddings"))),
            stage("logits", logits),
            stage("tokens", tokens),
        ]
    }

    /// Builds the prefill input for the golden `input_ids`, prefills the decoder's one slot with
    /// it, and decodes `steps - 1` tokens fed from `greedy`; the slot is released after.
    fn trajectory(
        &mut self,
        golden: &Golden,
        media: &[Media],
        items: &[Preprocessed],
        contract: &PrefillProgram,
        greedy: Option<&[i64]>,
        steps: usize,
    ) -> Result<Trajectory, Stopped> {
        let ids = golden_ids(golden).map_err(Stopped::Embeddings)?;
        let (chunk, capacity) = (self.chunk, self.capacity);
        let (device_args, numeric) = (self.device_args, self.contract);
        let decoder = self
            .decoder
            .get_or_insert_with(|| {
                let spec = decoder_spec(self.plugin, &self.config).map_err(|e| format!("{e:#}"))?;
                load_decoder(self.fixture.dir(), device_args, (chunk, capacity), spec, numeric)
                    .map_err(|e| format!("{e:#}"))
            })
            .as_mut()
            .map_err(|e| Stopped::Embeddings(format!("loading the decoder: {e}")))?;
        let (plugin, config, encoders) = (self.plugin, &self.config, &mut self.encoders);
        let input = contract_input(decoder, &ids, contract, plugin.name(), |index| {
            let (item, media) = items
                .get(index)
                .zip(media.get(index))
                .with_context(|| format!("the contract places item {index}, which the variant does not have"))?;
            encoders.encode_all(plugin, config, media.modality, item)
        });
        let (embeddings, positions, extras) = input.map_err(|e| Stopped::Embeddings(format!("{e:#}")))?;
        let values = Decoder::rows_as_f32(&embeddings).map_err(|e| Stopped::Embeddings(format!("{e:#}")))?;

        let slot = 0;
        let vocab = decoder.config().vocab;
        let run = (|| -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
            decoder.release(slot)?;
            let prefill =
                decoder.prefill_embeddings(slot, &embeddings, &positions, &extras, Logits::All).context("prefill")?;
            let last = prefill.len().checked_sub(vocab).context("the prefill returned no logits")?;
            let mut rows = vec![prefill[last..].to_vec()];
            for (step, &token) in greedy.unwrap_or_default().iter().take(steps.saturating_sub(1)).enumerate() {
                let token =
                    u32::try_from(token).with_context(|| format!("golden greedy token {token} does not fit u32"))?;
                let mut logits =
                    decoder.decode(&[(slot, token)]).with_context(|| format!("decode step {}", step + 1))?;
                rows.push(logits.pop().context("the decoder returned no logits")?);
            }
            Ok((prefill, rows))
        })();
        let released = decoder.release(slot);
        let (prefill, steps) = run.map_err(|e| Stopped::Logits(values.clone(), format!("{e:#}")))?;
        released.map_err(|e| Stopped::Logits(values.clone(), e.to_string()))?;
        Ok(Trajectory { embeddings: values, prefill, vocab, steps })
    }

    /// The variant's images (`images`) and audio clips (`audio`), read from the fixture.
    fn media(&self, golden: &Golden) -> Result<Vec<Media>> {
        let mut media = Vec::new();
        for (key, modality) in [("images", Modality::Image), ("audio", Modality::Audio)] {
            let paths: Vec<&str> = match golden.meta().get(key) {
                None => Vec::new(),
                Some(serde_json::Value::String(one)) => vec![one.as_str()],
                Some(serde_json::Value::Array(many)) => many
                    .iter()
                    .map(|v| v.as_str().with_context(|| format!("`{key}` holds a non-string: {v}")))
                    .collect::<Result<_>>()?,
                Some(other) => bail!("`{key}` is neither a path nor a list of paths: {other}"),
            };
            for path in paths {
                let path = self.fixture.dir().join(path);
                let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
                media.push(Media { path, modality, bytes });
            }
        }
        Ok(media)
    }

    /// Preprocesses one item as `generate` does.
    fn preprocess(&self, media: &Media) -> Result<Preprocessed> {
        preprocess(self.plugin, &self.config, media.modality, &media.bytes)
    }

    /// The expanded prompt against the golden `input_ids`, token by token.
    fn placeholder(&mut self, golden: &Golden, metas: &[ItemMeta]) -> Outcome {
        let (prompt, ids) = match (golden.prompt(), golden.input_ids()) {
            (Ok(p), Ok(i)) => (p, i),
            (Err(e), _) | (_, Err(e)) => return Outcome::Skipped(e.to_string()),
        };
        let request = LayoutRequest { prompt: prompt.into(), items: metas.iter().cloned().collect() };
        let layout = match self.plugin.prompt_layout(&self.config, &request) {
            Ok(layout) => layout,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        if layout.items.len() != metas.len() {
            return Outcome::Failed(format!("{} item layouts for {} items", layout.items.len(), metas.len()));
        }
        for (index, (item, meta)) in layout.items.iter().zip(metas).enumerate() {
            if item.feature_tokens != meta.grid.feature_tokens {
                return Outcome::Failed(format!(
                    "item {index} expands to {} feature tokens but its grid has {}",
                    item.feature_tokens, meta.grid.feature_tokens
                ));
            }
        }
        // The family's processor starts every prompt with its start token, outside the layout.
        let start = match crate::multimodal::resolve_prompt_start(&self.config, self.fixture.dir()) {
            Ok(start) => start,
            Err(e) => return Outcome::Failed(format!("{e:#}")),
        };
        let ids = match start {
            None => ids.as_slice(),
            Some(start) if ids.first() == Some(&i64::from(start)) => &ids[1..],
            Some(start) => {
                return Outcome::Failed(format!(
                    "the golden prompt does not start with the prompt start token {start}"
                ));
            }
        };
        let pieces = match self.pieces() {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(e),
        };
        match match_tokens(layout.text.as_bytes(), ids, pieces) {
            Ok(()) => Outcome::Passed { max_abs_diff: 0.0, tolerance: 0.0, detail: format!("{} tokens", ids.len()) },
            Err(why) => Outcome::Failed(why),
        }
    }

    fn pieces(&mut self) -> Result<&Pieces, String> {
        let path = self.fixture.dir().join("tokenizer.json");
        self.pieces
            .get_or_insert_with(|| Pieces::from_tokenizer_json(&path).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The prefill contract for the golden token ids (so it is checked apart from the
    /// placeholder stage).
    fn contract(&self, golden: &Golden, metas: &[ItemMeta]) -> Result<PrefillProgram, String> {
        let ids = golden.input_ids().map_err(|e| e.to_string())?;
        let token_ids = ids
            .iter()
            .map(|&id| u32::try_from(id).map_err(|_| format!("golden token id {id} does not fit u32")))
            .collect::<Result<RVec<u32>, String>>()?;
        let request = ContractRequest { token_ids, items: metas.iter().cloned().collect() };
        self.plugin.prefill_program(&self.config, &request).map_err(|e| e.to_string())
    }

    /// Runs each item through the plugin's encoder graph and compares the rows it places with
    /// the golden features of its modality.
    fn encoder(
        &mut self,
        golden: &Golden,
        media: &[Media],
        items: &[Preprocessed],
        contract: Option<&PrefillProgram>,
    ) -> Outcome {
        let mut outcomes = Vec::new();
        for (modality, key) in [(Modality::Image, "image_features"), (Modality::Audio, "audio_features")] {
            let indices: Vec<usize> = (0..media.len()).filter(|&i| media[i].modality == modality).collect();
            if indices.is_empty() {
                continue;
            }
            if !golden.has(key) {
                outcomes.push(Outcome::Skipped(format!("the goldens have no `{key}`")));
                continue;
            }
            let mut rows = Vec::new();
            for &index in &indices {
                let output = contract
                    .and_then(|c| c.placements.iter().find(|p| p.item as usize == index))
                    .map(|p| p.encoder_output.to_string());
                match self.encode(modality, &items[index], output.as_deref()) {
                    Ok(values) => rows.extend(values),
                    Err(e) => return Outcome::Failed(format!("item {index}: {e:#}")),
                }
            }
            let tol = self.tolerance("encoder");
            outcomes.push(compared(golden.check_f32(key, &rows, Tolerance::abs(tol)), format!("`{key}`")));
        }
        merge(outcomes)
    }

    /// One item through the smallest bucket that holds it: its placed rows.
    fn encode(&mut self, modality: Modality, item: &Preprocessed, output: Option<&str>) -> Result<Vec<f32>> {
        self.encoders.encode(self.plugin, &self.config, modality, item, output)
    }
}

/// Compiles (through the compile cache) and loads the checkpoint's decoder with one slot.
fn load_decoder(
    checkpoint: &Path,
    device_args: &DeviceArgs,
    (chunk, capacity): (usize, usize),
    spec: Option<DecoderSpec>,
    contract: Option<mlxcel_emit::NumericContract>,
) -> Result<Decoder> {
    let started = std::time::Instant::now();
    let compiler = Compiler::locate()?;
    let cache = device_args.compile_cache();
    let driver: Driver = device_args.driver.parse()?;
    let device = Device::new(driver)?;
    let options = DecoderOptions {
        shape: BundleShape { chunk, capacity, slots: 1 },
        target: Target::Cpu { cpu: device_args.target_cpu.clone() },
        spec,
        contract,
    };
    let decoder = Decoder::load(checkpoint, options, &device, &compiler, &cache)?;
    let how = match decoder.cache_outcome() {
        CacheOutcome::Hit => "from the compile cache",
        CacheOutcome::Compiled { .. } => "compiled",
    };
    eprintln!(
        "decoder: {how} in {:.2} s (capacity {capacity}, chunk {chunk}, one slot, cache {})",
        started.elapsed().as_secs_f64(),
        cache.dir().display()
    );
    Ok(decoder)
}

/// The golden `input_ids` as decoder token ids.
fn golden_ids(golden: &Golden) -> Result<Vec<u32>, String> {
    let ids = golden.input_ids().map_err(|e| e.to_string())?;
    ids.iter().map(|&id| u32::try_from(id).map_err(|_| format!("golden token id {id} does not fit u32"))).collect()
}

/// The merged prefill embeddings against `inputs_embeds`.
fn compare_embeddings(golden: &Golden, embeddings: &[f32], tol: f64) -> Outcome {
    let key = "inputs_embeds";
    if !golden.has(key) {
        return Outcome::Skipped(format!("the goldens have no `{key}`"));
    }
    let tol = Tolerance::abs(tol);
    compared(golden.check_f32(key, embeddings, tol), format!("`{key}`"))
}

/// Every prefill row against `logits`, and the teacher-forced steps against `decode_logits`;
/// a pass names each one's max-abs-diff.
fn compare_logits(golden: &Golden, trajectory: &Trajectory, forced: bool, tol: f64) -> Outcome {
    let tol = Tolerance::abs(tol);
    let each = |result: Result<Report, mlxcel_golden::Error>, what: String| match result {
        Ok(report) => {
            let detail = format!("{what} {:.3e}", report.max_abs_diff);
            Outcome::Passed { max_abs_diff: report.max_abs_diff, tolerance: report.tolerance.abs, detail }
        }
        Err(e) => Outcome::Failed(e.to_string()),
    };
    let mut outcomes = Vec::new();
    if golden.has("logits") {
        let what = format!("prefill `logits` ({} rows)", trajectory.prefill.len() / trajectory.vocab.max(1));
        outcomes.push(each(golden.check_f32("logits", &trajectory.prefill, tol), what));
    }
    if golden.has("decode_logits") {
        outcomes.push(if forced {
            let steps: Vec<f32> = trajectory.steps.concat();
            let what = format!("`decode_logits` ({} steps)", trajectory.steps.len());
            each(golden.check_f32("decode_logits", &steps, tol), what)
        } else {
            Outcome::Skipped("`decode_logits` needs the golden `greedy_tokens` to feed back".to_owned())
        });
    }
    merge(outcomes)
}

/// The argmax of each step (the first of equal maxima, as `torch.argmax`) against the golden
/// greedy tokens; with the golden tokens fed back, the tokens before the first difference are
/// those a greedy decode would share with the reference. Returns that count.
fn compare_tokens(want: &[i64], steps: &[Vec<f32>]) -> (usize, Outcome) {
    let got: Vec<i64> = steps.iter().map(|row| argmax(row) as i64).collect();
    let total = want.len();
    let matched = got.iter().zip(want).take_while(|(g, w)| g == w).count();
    let outcome = match (got.get(matched), want.get(matched)) {
        _ if got.len() != total => Outcome::Failed(format!("{} steps ran for {total} golden tokens", got.len())),
        (Some(token), Some(golden)) => {
            Outcome::Failed(format!("{matched}/{total}: token {matched} is {token} where the golden has {golden}"))
        }
        _ => Outcome::Checked(format!("{matched}/{total}")),
    };
    (matched, outcome)
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (index, &value) in row.iter().enumerate() {
        if value > row[best] {
            best = index;
        }
    }
    best
}

/// Outcomes of one stage over several modalities: the first failure, else the passes
/// combined, else the first skip.
fn merge(mut outcomes: Vec<Outcome>) -> Outcome {
    if let Some(failed) = outcomes.iter().position(|o| matches!(o, Outcome::Failed(_))) {
        return outcomes.swap_remove(failed);
    }
    let passes: Vec<(f64, f64, &str)> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Passed { max_abs_diff, tolerance, detail } => Some((*max_abs_diff, *tolerance, detail.as_str())),
            _ => None,
        })
        .collect();
    if let Some(&(_, tolerance, _)) = passes.first() {
        let max_abs_diff = passes.iter().map(|p| p.0).fold(0.0, f64::max);
        let detail = passes.iter().map(|p| p.2).collect::<Vec<_>>().join(", ");
        return Outcome::Passed { max_abs_diff, tolerance, detail };
    }
    outcomes.into_iter().next().unwrap_or_else(|| Outcome::Skipped("no media the kit can encode".to_owned()))
}

/// The items' tensors that the goldens also hold, concatenated along the first axis in item
/// order (as HF processors batch them).
fn compare_preprocess(golden: &Golden, items: &[Preprocessed]) -> Outcome {
    let mut names: Vec<&str> = Vec::new();
    for t in items.iter().flat_map(|i| i.tensors.iter()) {
        if !names.contains(&t.spec.name.as_str()) {
            names.push(t.spec.name.as_str());
        }
    }
    let tol = tolerance("preprocess");
    let mut worst = 0.0f64;
    let mut checked = Vec::new();
    for &name in &names {
        let Ok(want) = golden.tensor(name) else { continue };
        let parts: Vec<&Tensor> =
            items.iter().filter_map(|i| i.tensors.iter().find(|t| t.spec.name.as_str() == name)).collect();
        let mut shape: Vec<usize> = parts[0].spec.shape.iter().map(|&d| d as usize).collect();
        if shape.is_empty() {
            shape.push(1);
        }
        shape[0] = parts.iter().map(|t| t.spec.shape.first().copied().unwrap_or(1) as usize).sum();
        let inner = |t: &&Tensor| t.spec.shape.iter().skip(1).copied().collect::<Vec<_>>();
        let ragged = parts.iter().any(|t| inner(t) != inner(&parts[0]));
        if ragged || shape != want.shape {
            // A batch the reference padded to its longest item (audio clips of different
            // lengths): each item against the leading corner of its own golden row.
            if let Some(corners) = padded_corners(&want.shape, &parts) {
                match compare_corners(golden, name, &parts, &corners, tol) {
                    Ok(diff) => worst = worst.max(diff),
                    Err(e) => return Outcome::Failed(e),
                }
                checked.push(format!("`{name}` (each item within the reference's padded batch)"));
                continue;
            }
            return Outcome::Failed(format!(
                "`{name}` has shape {shape:?} over all items, the golden {:?}",
                want.shape
            ));
        }
        let result = match parts[0].spec.dtype {
            DType::F32 => {
                let values: Vec<f32> = parts.iter().flat_map(|t| t.to_f32().unwrap_or_default()).collect();
                golden.check_f32(name, &values, Tolerance::abs(tol))
            }
            DType::I64 | DType::I32 | DType::U8 | DType::Bool => {
                let values: Vec<i64> = parts.iter().flat_map(|t| int_values(t)).collect();
                golden.check_i64(name, &values)
            }
            other => {
                return Outcome::Failed(format!("`{name}` is {}; the kit compares f32 and integers", other.as_str()));
            }
        };
        match result {
            Ok(report) => worst = worst.max(report.max_abs_diff),
            Err(e) => return Outcome::Failed(e.to_string()),
        }
        checked.push(format!("`{name}`"));
    }
    if checked.is_empty() {
        let golden_stages: Vec<&str> = golden.stages().collect();
        return Outcome::Failed(format!(
            "none of the plugin's tensors ({}) is in the goldens ({})",
            names.join(", "),
            golden_stages.join(", ")
        ));
    }
    Outcome::Passed { max_abs_diff: worst, tolerance: tol, detail: checked.join(", ") }
}

/// When the golden `want` is a batch `[items, d1, d2, ...]` the reference padded to its largest
/// item and every part is one item `[1, e1, e2, ...]` with each `e <= d`: per part, the golden
/// flat indices of its leading corner, in the part's row-major order. `None` otherwise.
fn padded_corners(want: &[usize], parts: &[&Tensor]) -> Option<Vec<Vec<usize>>> {
    if want.first() != Some(&parts.len()) {
        return None;
    }
    let inner = &want[1..];
    let strides: Vec<usize> = (0..inner.len()).map(|d| inner[d + 1..].iter().product()).collect();
    let row: usize = inner.iter().product();
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let shape: Vec<usize> = part.spec.shape.iter().map(|&d| d as usize).collect();
            let (1, dims) = (*shape.first()?, &shape[1..]) else { return None };
            if dims.len() != inner.len() || dims.iter().zip(inner).any(|(e, d)| e > d) {
                return None;
            }
            let count: usize = dims.iter().product();
            Some(
                (0..count)
                    .map(|flat| {
                        let mut rest = flat;
                        let mut at = i * row;
                        for (d, &e) in dims.iter().enumerate().rev() {
                            at += (rest % e) * strides[d];
                            rest /= e;
                        }
                        at
                    })
                    .collect(),
            )
        })
        .collect()
}

/// The largest difference of each part from its corner of the golden `name` (f32 within `tol`,
/// integers exactly).
fn compare_corners(
    golden: &Golden,
    name: &str,
    parts: &[&Tensor],
    corners: &[Vec<usize>],
    tol: f64,
) -> Result<f64, String> {
    let want = golden.tensor(name).map_err(|e| e.to_string())?;
    let mut worst = 0.0f64;
    for (i, (part, corner)) in parts.iter().zip(corners).enumerate() {
        match part.spec.dtype {
            DType::F32 => {
                let want = want.as_f32().ok_or_else(|| format!("the golden `{name}` is not f32"))?;
                let got = part.to_f32().unwrap_or_default();
                for (k, (&g, &at)) in got.iter().zip(corner).enumerate() {
                    let d = f64::from((g - want[at]).abs());
                    if d.is_nan() || d > tol {
                        return Err(format!(
                            "`{name}` item {i}, value {k}: {g} against the golden's {} (tolerance {tol:e})",
                            want[at]
                        ));
                    }
                    worst = worst.max(d);
                }
            }
            _ => {
                let want = want.to_i64().ok_or_else(|| format!("the golden `{name}` is not integers"))?;
                for (k, (g, &at)) in int_values(part).into_iter().zip(corner).enumerate() {
                    if g != want[at] {
                        return Err(format!("`{name}` item {i}, value {k}: {g} against the golden's {}", want[at]));
                    }
                }
            }
        }
    }
    Ok(worst)
}

fn compare_positions(golden: &Golden, contract: &PrefillProgram) -> Outcome {
    if !golden.has("position_ids") {
        return Outcome::Skipped("the goldens have no `position_ids`".to_owned());
    }
    let ids = match &contract.positions {
        Positions::OneD { ids, .. } | Positions::MRope { ids, .. } => ids.to_vec(),
    };
    compared(golden.check_i64("position_ids", &ids), String::new())
}

fn compare_mask(golden: &Golden, contract: &PrefillProgram) -> Outcome {
    let Some(key) = ["attention_mask.full_attention", "attention_mask"].into_iter().find(|k| golden.has(k)) else {
        return Outcome::Skipped("the goldens have no `attention_mask.full_attention`".to_owned());
    };
    let len = contract.positions.len();
    let attends: Vec<i64> = contract.mask.materialize(len).iter().map(|&v| i64::from(v == 0.0)).collect();
    compared(golden.check_i64(key, &attends), format!("`{key}`"))
}

/// Walks the golden ids over the plugin's expanded prompt; the first token whose bytes do not
/// come next is the divergence.
fn match_tokens(text: &[u8], ids: &[i64], pieces: &Pieces) -> Result<(), String> {
    let mut at = 0;
    for (index, &id) in ids.iter().enumerate() {
        let piece = pieces.get(id).ok_or_else(|| format!("golden token id {id} is not in tokenizer.json"))?;
        if !text[at..].starts_with(piece) {
            let shown = &text[at..text.len().min(at + piece.len().max(16))];
            return Err(format!(
                "token {index} of {}: the golden has id {id} {:?}, the plugin's expanded prompt has {:?} at byte {at}",
                ids.len(),
                String::from_utf8_lossy(piece),
                String::from_utf8_lossy(shown)
            ));
        }
        at += piece.len();
    }
    if at != text.len() {
        let rest = &text[at..text.len().min(at + 32)];
        return Err(format!(
            "the plugin's expanded prompt continues after the golden's {} tokens with {:?}",
            ids.len(),
            String::from_utf8_lossy(rest)
        ));
    }
    Ok(())
}

fn int_values(tensor: &Tensor) -> Vec<i64> {
    let data = tensor.data.as_slice();
    match tensor.spec.dtype {
        DType::I64 => {
            data.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()
        }
        DType::I32 => data.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        _ => data.iter().map(|&b| i64::from(b)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_the_expanded_prompt_or_name_the_first_divergence() {
        let json = serde_json::json!({
            "model": {"type": "BPE", "vocab": {"a": 0, "Ġb": 1}},
            "added_tokens": [{"id": 7, "content": "<img>"}],
            "decoder": {"type": "ByteLevel"},
        });
        let dir = std::env::temp_dir().join(format!("mlxcel-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).expect("write tokenizer");
        let pieces = Pieces::from_tokenizer_json(&path).expect("pieces");
        std::fs::remove_dir_all(&dir).expect("clean up");

        assert_eq!(match_tokens(b"a<img><img> b", &[0, 7, 7, 1], &pieces), Ok(()));
        let short = match_tokens(b"a<img> b", &[0, 7, 7, 1], &pieces).expect_err("one image token too few");
        assert!(short.starts_with("token 2 of 4: the golden has id 7 \"<img>\""), "{short}");
        let long = match_tokens(b"a<img><img> b a", &[0, 7, 7, 1], &pieces).expect_err("text left over");
        assert!(long.contains("continues after the golden's 4 tokens"), "{long}");
    }

    #[test]
    fn the_decoder_chunk_holds_the_largest_bidirectional_block() {
        // No blocks or a fixture's 16-row image blocks keep 32; 256-row blocks need 256.
        let chunks: Vec<usize> = [0, 16, 32, 33, 256].map(chunk_holding).to_vec();
        assert_eq!(chunks, [32, 32, 32, 64, 256]);
    }

    #[test]
    fn greedy_tokens_count_the_steps_before_the_first_difference() {
        let steps = [vec![0.0, 2.0, 1.0], vec![3.0, 3.0, 1.0], vec![0.0, 0.0, 5.0]];
        let (matched, outcome) = compare_tokens(&[1, 0, 2], &steps);
        assert_eq!(matched, 3);
        assert_eq!(stage("tokens", outcome).to_string(), "tokens       ok       3/3");
        let (matched, outcome) = compare_tokens(&[1, 1, 2], &steps);
        assert_eq!(matched, 1);
        let line = stage("tokens", outcome).to_string();
        assert_eq!(line, "tokens       FAILED   1/3: token 1 is 0 where the golden has 1");
        let (matched, outcome) = compare_tokens(&[1, 0, 2, 2], &steps);
        assert_eq!(matched, 3);
        assert!(matches!(outcome, Outcome::Failed(why) if why == "3 steps ran for 4 golden tokens"));
    }
}
