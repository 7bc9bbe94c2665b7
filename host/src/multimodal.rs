//! Media requests through a family plugin: choose the plugin for the checkpoint, gate its
//! capabilities, decode and preprocess each item, expand the prompt's placeholders, run the
//! plugin's encoder graph (bucketed, through the compile cache) and merge its features into the
//! text embeddings as the prefill contract says. `generate --image` and `plugins verify` share
//! the pieces here.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use mlxcel_decoder::prefill::{Injection, Mode, Placement as ProgramPlacement, Program};
use mlxcel_decoder::{DecoderSpec, resolve_names};
use mlxcel_host::decoder::{Decoder, Extras, Positions, checkpoint_index};
use mlxcel_host::engine::RowContent;
use mlxcel_plugin_api::manifest::Limits;
use mlxcel_plugin_api::{
    Capability, CheckpointIndex, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, Error as PluginApiError, ErrorCode, ItemMeta, LayoutRequest, LoadedPlugin, MaskBase, MediaGrid,
    MediaItem, Modality, ModelConfig, PlaceMode, PluginSet, Positions as Laid, PrefillProgram, PreprocessOptions,
    Preprocessed, QualificationPolicy, ShapeBucket, Status, Tensor, TensorSpec,
};
use mlxcel_shim::{Arg, Checkpoint, CompileCache, Device, Driver, HostTensor, Invocation, Parameters, Session, Target};

use crate::encoder_cache::{Encoded, EncoderCache};
use crate::exec::{DeviceArgs, compile};

/// Compiler flags for encoder graphs. Encoders multiply hundreds of rows, so
/// IREE's data tiling (both operands packed into tiles before each matmul)
/// pays for itself; hoisting is off so the weights are packed per call into
/// scratch instead of into a second resident copy at load. Without it a
/// matmul whose left operand an earlier dispatch wrote ran at half speed:
/// measured on a 2B vision tower's fc2 shape (1024x5120 by 5120x1280, f32, 2
/// threads), the activation plus matmul took 319 ms, and 124 ms with these
/// flags. Decoder bundles keep the defaults: packing a weight per decode step
/// would read it twice (a 8960x1536 matvec: 3.0 ms, 9.0 ms data-tiled).
///
/// The execution model is IREE's asynchronous one (`coarse-fences`): a call returns once
/// its work is queued on the encoders' device, whose own workers run it, so the engine
/// thread keeps decoding running streams while an image is encoded.
const ENCODER_FLAGS: [&str; 3] =
    ["--iree-global-opt-data-tiling", "--iree-opt-const-expr-hoisting=false", "--iree-execution-model=async-external"];

/// A checkpoint's family plugin and the configuration it parsed: chosen once per model.
pub(crate) struct MediaModel<'a> {
    plugin: &'a LoadedPlugin,
    config: ModelConfig,
    /// The checkpoint's form when it is one a manifest qualifies apart (`mlx_affine`: the
    /// config records MLX's quantization); `None` for transformers' own forms.
    form: Option<&'static str>,
    /// The token every prompt starts with, when the family's processor starts them so.
    prompt_start: Option<u32>,
    /// The preprocessing options and encoder identity of each [`Detail`]: sha256 over what an
    /// item's features depend on besides its bytes (the plugin library, the parsed
    /// configuration with its processor settings, the preprocessing options and the
    /// checkpoint's weights), so a `low` item's digest is another than the same bytes' at the
    /// family's own resolution, unless the family serves both alike.
    full: Profile,
    low: Profile,
    /// Encoded items by digest (the server's; `generate` keeps none).
    cache: Option<EncoderCache>,
}

/// A media item's content digest (128 bits of sha256 over the encoder identity and the item's
/// bytes): the encoder cache's key and the prefix cache's name for the item's rows.
pub(crate) type Digest = [u8; 16];

/// How finely an image is seen: OpenAI's `image_url.detail`, defined with the wire format.
pub(crate) use crate::serve::api::Detail;

/// The options items of one [`Detail`] are preprocessed with, and the encoder identity they
/// give.
struct Profile {
    options: PreprocessOptions,
    identity: [u8; 32],
}

impl<'a> MediaModel<'a> {
    /// Chooses the plugin that accepts the checkpoint in `model` and has it parse the
    /// checkpoint's configuration.
    pub(crate) fn open(plugins: &'a PluginSet, plugin_dir: &Path, model: &Path) -> Result<Self> {
        let config_json = read_text(&model.join("config.json"))?;
        let plugin = plugins.for_config(&config_json).map_err(|e| {
            anyhow!(
                "{} takes no images: no plugin in {} accepts it ({e}); images need a vision-language checkpoint and its family plugin",
                model.display(),
                plugin_dir.display()
            )
        })?;
        let config = plugin
            .parse_config(&config_json, &processor_json(model)?)
            .with_context(|| format!("the {} plugin cannot read {}", plugin.name(), model.display()))?;
        let root: serde_json::Value = serde_json::from_str(&config_json)
            .with_context(|| format!("{} is not json", model.join("config.json").display()))?;
        let quantized = mlxcel_decoder::QuantConfig::from_config(&root)
            .map_err(|e| anyhow!("{}: {e}", model.join("config.json").display()))?
            .is_some();
        let prompt_start = resolve_prompt_start(&config, model)?;
        let weights = mlxcel_host::decoder::weights_identity(&Checkpoint::open(model)?);
        let profile = |detail| {
            let options = preprocess_options(&plugin.manifest().limits, detail);
            let identity = encoder_identity(plugin, &config, &options, &weights);
            Profile { options, identity }
        };
        let (full, low) = (profile(Detail::Full), profile(Detail::Low));
        Ok(Self { plugin, config, form: quantized.then_some("mlx_affine"), prompt_start, full, low, cache: None })
    }

    /// Keeps encoded items in an encoder cache of `budget` bytes.
    pub(crate) fn with_encoder_cache(self, budget: u64) -> Self {
        Self { cache: Some(EncoderCache::new(budget)), ..self }
    }

    pub(crate) fn encoder_cache(&self) -> Option<&EncoderCache> {
        self.cache.as_ref()
    }

    /// The digest of one item's bytes seen at `detail`, under this model's encoder identity.
    pub(crate) fn digest(&self, bytes: &[u8], detail: Detail) -> Digest {
        media_digest(&self.profile(detail).identity, bytes)
    }

    fn profile(&self, detail: Detail) -> &Profile {
        match detail {
            Detail::Full => &self.full,
            Detail::Low => &self.low,
        }
    }

    /// Every problem the plugin finds with the checkpoint's tensors (a module not found, a
    /// tensor missing, misshapen or stored in another dtype than the config names), before
    /// anything compiles. Run where images are to be served; a text prompt needs only the
    /// plugin's decoder spec.
    pub(crate) fn check_checkpoint(&self, model: &Path) -> Result<()> {
        let index = plugin_index(&Checkpoint::open(model)?);
        if let Some(report) = self.plugin.check_checkpoint(&self.config, &index)?
            && !report.problems.is_empty()
        {
            let problems: Vec<&str> = report.problems.iter().map(|p| p.as_str()).collect();
            bail!(
                "{} does not fit the {} plugin's encoder: {}",
                model.display(),
                self.plugin.name(),
                problems.join("; ")
            );
        }
        Ok(())
    }

    /// Refuses, before anything compiles, an encoder compute the plugin does not offer: the
    /// smallest bucket of each modality it serves, emitted in `compute` and dropped (emitting
    /// is cheap; nothing compiles).
    pub(crate) fn check_compute(&self, compute: EncoderCompute) -> Result<()> {
        if compute == EncoderCompute::F32 {
            return Ok(());
        }
        for (capability, modality) in [(Capability::Image, Modality::Image), (Capability::Audio, Modality::Audio)] {
            let status = self.plugin.manifest().capability(capability).map(|c| c.status);
            if !matches!(status, Some(Status::Qualified | Status::Experimental)) {
                continue;
            }
            let buckets = self.plugin.encoder_buckets(&self.config, modality)?;
            let Some(bucket) = buckets.first() else { continue };
            let request = EncoderGraphRequest { modality, bucket: bucket.id.clone() };
            self.plugin.encoder_graph(&self.config, &request, &EncoderTarget::unknown(), compute).with_context(|| {
                format!(
                    "--compute bf16 computes the {} encoder in {}; leave --compute at f32 for media from this checkpoint",
                    modality.as_str(),
                    compute.name()
                )
            })?;
        }
        Ok(())
    }

    pub(crate) fn plugin(&self) -> &'a LoadedPlugin {
        self.plugin
    }

    /// Compiles (or loads from the compile cache) every encoder bucket of each modality the
    /// plugin's manifest does not mark unsupported; the number of buckets.
    pub(crate) fn warm(&self, encoders: &mut Encoders) -> Result<usize> {
        let mut buckets = 0;
        for (capability, modality) in [(Capability::Image, Modality::Image), (Capability::Audio, Modality::Audio)] {
            let status = self.plugin.manifest().capability(capability).map(|c| c.status);
            if matches!(status, Some(Status::Qualified | Status::Experimental)) {
                buckets += encoders.warm(self.plugin, &self.config, modality)?;
            }
        }
        Ok(buckets)
    }

    /// The text decoder spec the checkpoint's plugin brings, if any.
    pub(crate) fn decoder_spec(&self) -> Result<Option<DecoderSpec>> {
        decoder_spec(self.plugin, &self.config)
    }

    /// The token the family's processor starts every prompt with, if it does.
    pub(crate) fn prompt_start(&self) -> Option<u32> {
        self.prompt_start
    }

    /// Checks that a request with `images` images and `clips` audio clips may be served under
    /// `policy`: the capability gate (`image`, and `multi_image` for more than one; `audio`),
    /// the checkpoint's form where the manifest qualifies it apart (`forms.mlx_affine`), and the
    /// manifest's image count limit.
    pub(crate) fn admit(&self, images: usize, clips: usize, policy: QualificationPolicy) -> Result<(), MediaRefusal> {
        let mut capabilities = Vec::new();
        if images > 0 {
            capabilities.push(Capability::Image);
        }
        if images > 1 {
            capabilities.push(Capability::MultiImage);
        }
        if clips > 0 {
            capabilities.push(Capability::Audio);
        }
        for capability in capabilities {
            self.plugin.check_capability(capability, policy).map_err(MediaRefusal::Capability)?;
        }
        if let Some(form) = self.form {
            self.plugin.check_form(form, policy).map_err(MediaRefusal::Capability)?;
        }
        if let Some(limit) = self.plugin.manifest().limits.max_images_per_request
            && images as u64 > u64::from(limit)
        {
            return Err(MediaRefusal::TooMany { images, limit, plugin: self.plugin.name().to_owned() });
        }
        Ok(())
    }

    /// Preprocesses every item (encoded bytes, their modality and the detail an image is seen
    /// at, in prompt order), refusing an image whose declared size exceeds `max_input_pixels`
    /// before decoding it; an item the encoder cache holds at that detail is taken from it
    /// instead. A failure is the input's unless the plugin reports a fault of its own.
    pub(crate) fn request(
        &'a self,
        inputs: &[MediaInput],
        max_input_pixels: u64,
    ) -> Result<MediaRequest<'a>, MediaError> {
        let mut items = Vec::new();
        let mut seen = [0usize; 2];
        for input in inputs {
            let (kind, count) = match input.modality {
                Modality::Image => ("image", &mut seen[0]),
                _ => ("audio clip", &mut seen[1]),
            };
            *count += 1;
            let number = *count;
            let digest = self.digest_of(input);
            if let Some(encoded) = self.cache.as_ref().and_then(|c| c.get(&digest)) {
                items.push((Item::Encoded(encoded), digest, input.modality));
                continue;
            }
            let item = self.item(input, max_input_pixels).with_context(|| format!("{kind} {number}"));
            let item = item.map_err(|e| MediaError::classify(e, Fault::Input))?;
            let bucket = self.bucket_for(input.modality, &item).with_context(|| format!("{kind} {number}"));
            let bucket = bucket.map_err(|e| MediaError::classify(e, Fault::Server))?;
            items.push((Item::Preprocessed(item, bucket), digest, input.modality));
        }
        Ok(self.assemble(items, self.cache.as_ref()))
    }

    /// An item's digest: its bytes under the encoder identity of its detail (an audio clip has
    /// one resolution, its full one), and its modality, so no image and clip share a digest.
    fn digest_of(&self, input: &MediaInput) -> Digest {
        match input.modality {
            Modality::Image => self.digest(&input.bytes, input.detail),
            other => {
                let mut tagged = other.as_str().as_bytes().to_vec();
                tagged.push(0);
                tagged.extend_from_slice(&input.bytes);
                self.digest(&tagged, Detail::Full)
            }
        }
    }

    fn item(&self, input: &MediaInput, max_input_pixels: u64) -> Result<Preprocessed> {
        let options = match input.modality {
            Modality::Image => self.profile(input.detail).options.clone(),
            _ => self.full.options.clone(),
        };
        preprocess_with(self.plugin, &self.config, input.modality, &input.bytes, &options, max_input_pixels)
    }

    /// The smallest of the plugin's encoder buckets for `modality` that holds `item`.
    fn bucket_for(&self, modality: Modality, item: &Preprocessed) -> Result<ShapeBucket> {
        smallest_bucket(self.plugin.encoder_buckets(&self.config, modality)?, item)
    }

    fn assemble(&self, items: Vec<(Item, Digest, Modality)>, cache: Option<&'a EncoderCache>) -> MediaRequest<'a> {
        let metas =
            items.iter().map(|(p, _, modality)| ItemMeta { modality: *modality, grid: p.grid().clone() }).collect();
        let (items, digests) = items.into_iter().map(|(item, digest, _)| (item, digest)).unzip();
        MediaRequest {
            plugin: self.plugin,
            config: self.config.clone(),
            items,
            digests,
            metas,
            prompt_start: self.prompt_start,
            cache,
            program: None,
        }
    }
}

/// One media item of a request as the client sent it: its encoded bytes (an image file, a WAV
/// clip), its modality, and for an image the detail it is seen at.
pub(crate) struct MediaInput {
    pub(crate) bytes: Vec<u8>,
    pub(crate) modality: Modality,
    pub(crate) detail: Detail,
}

/// Whose fault a failed media request is: what the server's status code says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The request's media: not an image, corrupt, too large, a form the family does not take.
    Input,
    /// Ours: the plugin failed on input it accepted, or an encoder did not compile or run.
    Server,
}

/// A media request that failed after it was admitted, with whose fault it is.
#[derive(Debug, thiserror::Error)]
#[error("{error:#}")]
pub(crate) struct MediaError {
    pub(crate) fault: Fault,
    error: anyhow::Error,
}

impl MediaError {
    pub(crate) fn server(error: anyhow::Error) -> Self {
        MediaError { fault: Fault::Server, error }
    }

    /// Classifies `error` by what caused it: a plugin's error by its code (invalid, unsupported
    /// or over a limit: the input; internal or panicked: ours), any other plugin-boundary error
    /// as ours, an image that does not decode as the input's, and anything else as `otherwise`
    /// (the step's own default: input while reading the client's bytes, ours afterwards).
    pub(crate) fn classify(error: anyhow::Error, otherwise: Fault) -> Self {
        let fault = error
            .chain()
            .find_map(|cause| {
                if let Some(e) = cause.downcast_ref::<PluginApiError>() {
                    return Some(match e {
                        PluginApiError::Plugin { error, .. } => match error.code {
                            ErrorCode::InvalidArgument | ErrorCode::Unsupported | ErrorCode::ResourceExhausted => {
                                Fault::Input
                            }
                            ErrorCode::Internal | ErrorCode::Panicked => Fault::Server,
                        },
                        _ => Fault::Server,
                    });
                }
                cause.downcast_ref::<mlxcel_media::Error>().map(|_| Fault::Input)
            })
            .unwrap_or(otherwise);
        MediaError { fault, error }
    }
}

/// Why a media request is refused before any work: the caller's fault, not the server's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MediaRefusal {
    #[error(transparent)]
    Capability(PluginApiError),
    #[error("{images} images in one request; the {plugin} plugin takes at most {limit}")]
    TooMany { images: usize, limit: u32, plugin: String },
}

/// The compute of the encoders beside a decoder computing under `decoder` (`None`: f32 compute):
/// the same activations and sums.
pub(crate) fn encoder_compute(decoder: Option<&mlxcel_emit::NumericContract>) -> EncoderCompute {
    decoder.map_or(EncoderCompute::F32, EncoderCompute::beside)
}

/// The decoder spec `plugin` brings for the checkpoint `config` describes; `None` reads the
/// preset for its text model type.
pub(crate) fn decoder_spec(plugin: &LoadedPlugin, config: &ModelConfig) -> Result<Option<DecoderSpec>> {
    plugin.decoder_spec(config).with_context(|| format!("the {} plugin's text decoder", plugin.name()))
}

/// The token every prompt of the checkpoint in `model` starts with, when `config`'s family says
/// its processor starts them so ([`mlxcel_plugin_api::PROMPT_START`]): the tokenizer's
/// `bos_token`, or its `eos_token` when it has none, as the processor picks it. An id the
/// plugin read from `config.json` must be that token's.
pub(crate) fn resolve_prompt_start(config: &ModelConfig, model: &Path) -> Result<Option<u32>> {
    let Some(declared) =
        config.summary.special_tokens.iter().find(|t| t.role.as_str() == mlxcel_plugin_api::PROMPT_START)
    else {
        return Ok(None);
    };
    let token = mlxcel_host::text::bos_or_eos(model)?.with_context(|| {
        format!(
            "the family starts every prompt with the tokenizer's bos_token (or eos_token), and {} names neither",
            model.join("tokenizer_config.json").display()
        )
    })?;
    let id = mlxcel_host::text::Tokenizer::load(model)?
        .token_id(&token)
        .with_context(|| format!("the tokenizer has no token {token:?}, which every prompt starts with"))?;
    if declared.id != mlxcel_plugin_api::PROMPT_START_UNKNOWN && declared.id != id {
        bail!("config.json says prompts start with token {}, the tokenizer's {token:?} is {id}", declared.id);
    }
    Ok(Some(id))
}

/// `ids` started with `start` when it does not already start with it.
pub(crate) fn started(mut ids: Vec<u32>, start: Option<u32>) -> Vec<u32> {
    if let Some(start) = start
        && ids.first() != Some(&start)
    {
        ids.insert(0, start);
    }
    ids
}

/// The pixels an input image may declare before it is decoded (PIL's default
/// `Image.MAX_IMAGE_PIXELS`): larger ones are refused as decompression bombs.
pub(crate) const MAX_INPUT_PIXELS: u64 = 89_478_485;

/// One item of a request: preprocessed, or already encoded (an encoder-cache hit).
enum Item {
    /// Preprocessed, with the encoder bucket chosen for it while the request was prepared.
    Preprocessed(Preprocessed, ShapeBucket),
    Encoded(Arc<Encoded>),
}

impl Item {
    fn grid(&self) -> &MediaGrid {
        match self {
            Item::Preprocessed(p, _) => &p.grid,
            Item::Encoded(e) => &e.grid,
        }
    }
}

/// A request's images, preprocessed by the family plugin of the checkpoint.
pub(crate) struct MediaRequest<'a> {
    plugin: &'a LoadedPlugin,
    config: ModelConfig,
    items: Vec<Item>,
    digests: Vec<Digest>,
    /// Where encoded items go, when the model keeps an encoder cache.
    cache: Option<&'a EncoderCache>,
    metas: Vec<ItemMeta>,
    prompt_start: Option<u32>,
    /// The expanded prompt's token ids and the plugin's prefill program for them, asked for
    /// by [`MediaRequest::expand`] so that every plugin call a request makes happens while it
    /// is prepared (under the preparation deadline), none on the engine thread.
    program: Option<(Vec<u32>, PrefillProgram)>,
}

impl<'a> MediaRequest<'a> {
    /// The text decoder spec the checkpoint's plugin brings, if any.
    pub(crate) fn decoder_spec(&self) -> Result<Option<DecoderSpec>> {
        decoder_spec(self.plugin, &self.config)
    }

    /// Host bytes the request holds: each item's preprocessed tensors until it is encoded, then
    /// its features (shared with the encoder cache when it keeps them, but held all the same).
    pub(crate) fn host_bytes(&self) -> u64 {
        let item = |item: &Item| match item {
            Item::Preprocessed(p, _) => p.tensors.iter().map(|t| t.data.len()).sum::<usize>(),
            Item::Encoded(e) => e.outputs.iter().map(|(_, v)| std::mem::size_of_val(v.as_slice())).sum(),
        };
        self.items.iter().map(item).sum::<usize>() as u64
    }

    /// `generate --image/--audio`: opens the checkpoint's plugin, checks the request under
    /// `policy` and preprocesses every image file, then every audio file.
    pub(crate) fn open(
        plugins: &'a PluginSet,
        plugin_dir: &Path,
        model: &Path,
        (images, clips): (&[PathBuf], &[PathBuf]),
        policy: QualificationPolicy,
        compute: EncoderCompute,
    ) -> Result<Self> {
        let media = MediaModel::open(plugins, plugin_dir, model)?;
        media.check_checkpoint(model)?;
        media.check_compute(compute)?;
        media.admit(images.len(), clips.len(), policy)?;
        let mut items = Vec::new();
        let files = images.iter().map(|p| (p, Modality::Image)).chain(clips.iter().map(|p| (p, Modality::Audio)));
        for (path, modality) in files {
            let kind = if modality == Modality::Image { "an image" } else { "audio" };
            let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let input = MediaInput { bytes, modality, detail: Detail::Full };
            let item = media
                .item(&input, MAX_INPUT_PIXELS)
                .with_context(|| format!("cannot use {} as {kind}", path.display()))?;
            let bucket = media.bucket_for(modality, &item)?;
            items.push((Item::Preprocessed(item, bucket), media.digest_of(&input), modality));
        }
        Ok(media.assemble(items, None))
    }

    /// Expands the rendered prompt's placeholders with the plugin's layout and tokenizes the
    /// result, checking that each item got as many feature tokens as its grid has rows, and asks
    /// the plugin for its prefill program over those tokens. The items were accepted, so a
    /// failure is ours unless the plugin blames the input.
    pub(crate) fn expand(
        &mut self,
        prompt: &str,
        tokenizer: &mlxcel_host::text::Tokenizer,
    ) -> Result<Vec<u32>, MediaError> {
        let classify = |e| MediaError::classify(e, Fault::Server);
        let ids = self.expand_inner(prompt, tokenizer).map_err(classify)?;
        let request = ContractRequest { token_ids: ids.as_slice().into(), items: self.metas.iter().cloned().collect() };
        let program = self.plugin.prefill_program(&self.config, &request).map_err(|e| classify(e.into()))?;
        self.program = Some((ids.clone(), program));
        Ok(ids)
    }

    fn expand_inner(&self, prompt: &str, tokenizer: &mlxcel_host::text::Tokenizer) -> Result<Vec<u32>> {
        let request = LayoutRequest { prompt: prompt.into(), items: self.metas.iter().cloned().collect() };
        let layout = self.plugin.prompt_layout(&self.config, &request)?;
        if layout.items.len() != self.items.len() {
            bail!("the plugin laid out {} items for {} images", layout.items.len(), self.items.len());
        }
        let ids = started(tokenizer.encode(layout.text.as_str(), false)?, self.prompt_start);
        let mut expected: HashMap<u32, usize> = HashMap::new();
        for item in layout.items.iter() {
            *expected.entry(item.feature_token_id).or_default() += item.feature_tokens as usize;
        }
        for (&token, &count) in &expected {
            let found = ids.iter().filter(|&&id| id == token).count();
            if found != count {
                bail!(
                    "the expanded prompt tokenizes to {found} feature tokens (id {token}) where the images need {count}"
                );
            }
        }
        Ok(ids)
    }

    /// Runs each item not encoded yet through its modality's encoder, once, keeping the outputs
    /// in the encoder cache when there is one, and waits for each. A failure is ours (compiling
    /// or running an encoder) unless the plugin blames the input.
    pub(crate) fn encode(&mut self, encoders: &mut Encoders) -> Result<(), MediaError> {
        while let Some((index, encoding)) = self.start_next(encoders)? {
            self.finish_item(index, encoding)?;
        }
        Ok(())
    }

    /// Starts the first item not encoded yet on the encoders' device without waiting for it
    /// ([`Encoders::start`]): its index and the running encoder, or `None` when every item is
    /// encoded. [`MediaRequest::finish_item`] takes the result.
    pub(crate) fn start_next(&self, encoders: &mut Encoders) -> Result<Option<(usize, Encoding)>, MediaError> {
        let Some(index) = self.items.iter().position(|item| matches!(item, Item::Preprocessed(..))) else {
            return Ok(None);
        };
        let Item::Preprocessed(item, bucket) = &self.items[index] else {
            return Ok(None);
        };
        let modality = self.metas.get(index).map_or(Modality::Image, |m| m.modality);
        let encoding = encoders
            .start(self.plugin, &self.config, modality, bucket, item)
            .with_context(|| format!("encoding item {}", index + 1))
            .map_err(|e| MediaError::classify(e, Fault::Server))?;
        Ok(Some((index, encoding)))
    }

    /// Takes item `index`'s features from its finished (or still running: this waits) encoder
    /// and keeps them in the encoder cache when there is one.
    pub(crate) fn finish_item(&mut self, index: usize, encoding: Encoding) -> Result<(), MediaError> {
        let Some(Item::Preprocessed(item, _)) = self.items.get(index) else {
            let e = anyhow::anyhow!("invariant: item {index} is not waiting for its encoder");
            return Err(MediaError::server(e));
        };
        let grid = item.grid.clone();
        let outputs = encoding
            .finish()
            .with_context(|| format!("encoding item {}", index + 1))
            .map_err(|e| MediaError::classify(e, Fault::Server))?;
        let encoded = Arc::new(Encoded { grid, outputs });
        if let (Some(cache), Some(digest)) = (self.cache, self.digests.get(index)) {
            cache.insert(*digest, Arc::clone(&encoded));
        }
        self.items[index] = Item::Encoded(encoded);
        Ok(())
    }

    /// Asks the plugin's contract where the encoded items' features go and merges them into
    /// the text embeddings of `ids`: what `Decoder::prefill_embeddings` takes, with what each
    /// row holds (a token, or a row of an item named by its digest). Every item must have been
    /// encoded ([`MediaRequest::encode`]). A failure is ours (a contract the decoder cannot
    /// apply) unless the plugin blames the input.
    pub(crate) fn prefill_input(
        &self,
        decoder: &mut Decoder,
        ids: &[u32],
    ) -> Result<(HostTensor, Positions, Extras, Vec<RowContent>), MediaError> {
        self.prefill_input_inner(decoder, ids).map_err(|e| MediaError::classify(e, Fault::Server))
    }

    fn prefill_input_inner(
        &self,
        decoder: &mut Decoder,
        ids: &[u32],
    ) -> Result<(HostTensor, Positions, Extras, Vec<RowContent>)> {
        let contract = match &self.program {
            Some((expanded, program)) if expanded == ids => program,
            Some(_) => bail!("invariant: the prompt to prefill is not the one expanded"),
            None => bail!("invariant: the request's media was merged before its prompt was expanded"),
        };
        let contents = row_contents(ids, contract, &self.digests)?;
        let (embeddings, positions, extras) =
            contract_input(decoder, ids, contract, self.plugin.name(), |index| match self.items.get(index) {
                Some(Item::Encoded(encoded)) => Ok(encoded.outputs.clone()),
                Some(Item::Preprocessed(..)) => bail!("invariant: item {index} was merged before it was encoded"),
                None => bail!("the contract places item {index}, which the request does not have"),
            })?;
        Ok((embeddings, positions, extras, contents))
    }
}

/// What each prompt row holds under `contract`: its token, or, where the contract places an
/// item's rows (or injects them), the item's digest and the row's index in that placement.
fn row_contents(ids: &[u32], contract: &PrefillProgram, digests: &[Digest]) -> Result<Vec<RowContent>> {
    let mut contents: Vec<RowContent> = ids.iter().map(|&t| RowContent::Token(t)).collect();
    let placed = contract.placements.iter().map(|p| (p.item, &p.tokens));
    let injected = contract.injections.iter().map(|i| (i.item, &i.tokens));
    for (item, tokens) in placed.chain(injected) {
        let digest = *digests
            .get(item as usize)
            .with_context(|| format!("the contract places item {item}, which the request does not have"))?;
        for (row, t) in tokens.indices().into_iter().enumerate() {
            let content = contents
                .get_mut(t)
                .with_context(|| format!("the contract places a row at token {t} of a {}-token prompt", ids.len()))?;
            if let RowContent::Token(token) = *content {
                *content = RowContent::Media { digest, row: row as u32, token };
            }
        }
    }
    Ok(contents)
}

/// The options an item seen at `detail` is preprocessed with, from its plugin's manifest
/// limits: the per-image pixel limit, or for `low` the family's declared low-detail budget
/// within it. A family that declares none has one resolution, so `low` is preprocessed (and
/// cached) exactly as `high`.
fn preprocess_options(limits: &Limits, detail: Detail) -> PreprocessOptions {
    let max_pixels = match (detail, limits.low_detail_max_pixels) {
        (Detail::Low, Some(low)) => Some(limits.max_pixels_per_image.map_or(low, |max| max.min(low))),
        _ => limits.max_pixels_per_image,
    };
    // The manifest's audio limit bounds each clip; the plugin refuses a longer one clearly.
    let max_audio_ms = limits.max_audio_seconds_per_request.map(|s| (s * 1000.0).round() as u64);
    PreprocessOptions { max_pixels: max_pixels.into(), max_audio_ms: max_audio_ms.into(), ..Default::default() }
}

/// See [`MediaModel`]'s `identity`.
fn encoder_identity(
    plugin: &LoadedPlugin,
    config: &ModelConfig,
    options: &PreprocessOptions,
    weights: &str,
) -> [u8; 32] {
    identity_of(&[
        plugin.name(),
        plugin.manifest().plugin.sha256.as_str(),
        &format!("{:?}", config.summary),
        config.family.as_str(),
        &format!("{options:?}"),
        weights,
    ])
}

/// sha256 over `parts`, each length-prefixed.
fn identity_of(parts: &[&str]) -> [u8; 32] {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for part in std::iter::once("mlxcel encoder identity 1").chain(parts.iter().copied()) {
        // Length-prefixed, so no two different part lists hash the same bytes.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// An item's [`Digest`] under an encoder `identity`.
fn media_digest(identity: &[u8; 32], bytes: &[u8]) -> Digest {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(identity);
    h.update(bytes);
    let full: [u8; 32] = h.finalize().into();
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&full[..16]);
    digest
}

/// The prefill input of `ids` under `plugin`'s contract: the text embeddings scaled by the
/// contract's text scale, then the contract as a [`Program`] (each placement's rows written
/// over, or added to, its tokens; each injection's rows at its tokens for the decoder's
/// injected layers), the contract's positions, and its mask as extras. `features(item)`
/// encodes one item once and returns every encoder output's rows. [`MediaRequest::prefill_input`]
/// and `plugins verify` both build their prefill here.
pub(crate) fn contract_input(
    decoder: &mut Decoder,
    ids: &[u32],
    contract: &PrefillProgram,
    plugin: &str,
    mut features: impl FnMut(usize) -> Result<Vec<(String, Vec<f32>)>>,
) -> Result<(HostTensor, Positions, Extras)> {
    check_text_scale(contract.text_scale, decoder.embed_scale(), plugin)?;
    let raw = decoder.embed(ids).context("embedding the prompt")?;
    // Under bf16 activations the text rows are scaled in bf16, merged in f32 (the features are
    // bf16 values widened, so a replaced row is exact) and rounded once, as torch adds or
    // scatters bf16 rows.
    let dtype = raw.dtype();
    let text = Decoder::scale_embeddings(&raw, contract.text_scale)?;
    let (n, hidden) = (ids.len(), decoder.config().hidden);
    let mut encoded: BTreeMap<usize, Vec<(String, Vec<f32>)>> = BTreeMap::new();
    let mut output = |item: usize, name: &str| -> Result<Vec<f32>> {
        let outputs = match encoded.entry(item) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(features(item)?),
        };
        let (_, rows) = outputs.iter().find(|(n, _)| n == name).with_context(|| {
            format!("the contract places encoder output `{name}` of item {item}, which the encoder does not return")
        })?;
        Ok(rows.clone())
    };
    let mut program = Program::default();
    for placement in contract.placements.iter() {
        let tokens = placement.tokens.indices();
        let rows = output(placement.item as usize, placement.encoder_output.as_str())?;
        let mode = match placement.mode {
            PlaceMode::Replace => Mode::Replace,
            PlaceMode::Add => Mode::Add,
        };
        program.placements.push(ProgramPlacement { mode, rows, tokens });
    }
    for injection in contract.injections.iter() {
        let tokens = injection.tokens.indices();
        let rows = output(injection.item as usize, injection.encoder_output.as_str())?;
        program.injections.push(Injection { layer: injection.decoder_layer as usize, rows, tokens });
    }
    let merged = program
        .apply(&Decoder::rows_as_f32(&text)?, n, hidden, decoder.config().injected_layers)
        .with_context(|| format!("the {plugin} plugin's prefill contract"))?;
    let embeddings = Decoder::rows_from_f32(dtype, vec![n, hidden], &merged.embeddings)?;
    let injections = merged
        .injections
        .iter()
        .map(|rows| Decoder::rows_from_f32(dtype, vec![n, hidden], rows))
        .collect::<Result<Vec<_>, _>>()?;
    let extras = Extras { bidirectional: bidirectional(contract)?, injections, row_tokens: ids.to_vec() };
    Ok((embeddings, positions(&contract.positions, n)?, extras))
}

/// `processor_config.json` (or `preprocessor_config.json`) of a checkpoint, empty when absent.
/// The checkpoint's processor config as one JSON object, found as transformers finds it:
/// `processor_config.json` when it nests the image processor's fields (`image_processor`,
/// transformers 5); otherwise the image processor's fields flat in `preprocessor_config.json`
/// (the Hub's checkpoints) together with `processor_config.json`'s processor fields
/// (`image_seq_length`, ...), a field the two files set to different values refused as
/// ambiguous. Empty when neither file exists (the processor's defaults).
pub(crate) fn processor_json(dir: &Path) -> Result<String> {
    let read = |name: &str| -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        let path = dir.join(name);
        if !path.exists() {
            return Ok(None);
        }
        match serde_json::from_str(&read_text(&path)?) {
            Ok(serde_json::Value::Object(map)) => Ok(Some(map)),
            Ok(_) => bail!("{} is not a JSON object", path.display()),
            Err(e) => bail!("{} is not valid JSON: {e}", path.display()),
        }
    };
    let processor = read("processor_config.json")?;
    if let Some(nested) = processor.as_ref().filter(|p| p.contains_key("image_processor")) {
        return Ok(serde_json::Value::Object(nested.clone()).to_string());
    }
    let merged = match (processor, read("preprocessor_config.json")?) {
        (None, None) => return Ok(String::new()),
        (Some(one), None) | (None, Some(one)) => one,
        (Some(processor), Some(mut preprocessor)) => {
            for (key, value) in processor {
                match preprocessor.get(&key) {
                    Some(other) if *other != value => bail!(
                        "processor_config.json and preprocessor_config.json disagree on `{key}` ({value} and {other}); \
                         which applies is ambiguous"
                    ),
                    _ => {
                        preprocessor.insert(key, value);
                    }
                }
            }
            preprocessor
        }
    };
    Ok(serde_json::Value::Object(merged).to_string())
}

/// The checkpoint's tensors as the plugin ABI lists them; a tensor of a dtype the ABI does not
/// name is left out (no encoder graph can declare it, so a graph naming it is told it is missing).
pub(crate) fn plugin_index(checkpoint: &Checkpoint) -> CheckpointIndex {
    let tensors = checkpoint
        .tensors()
        .iter()
        .filter_map(|(name, entry)| {
            let shape: Vec<u64> = entry.shape.iter().map(|&d| d as u64).collect();
            safetensors_dtype(&entry.dtype).map(|dtype| TensorSpec::new(name.as_str(), dtype, &shape))
        })
        .collect();
    CheckpointIndex { tensors }
}

/// The ABI's dtype for a safetensors dtype name.
pub(crate) fn safetensors_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I32" => DType::I32,
        "I64" => DType::I64,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        _ => return None,
    })
}

pub(crate) fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Preprocesses one item. Images are decoded to RGB by the host (PNG, JPEG, WebP, GIF, exactly
/// as transformers' `load_image`), and passed encoded only if the plugin does not take decoded
/// pixels, or the bytes are in a format the host does not read (a plugin may).
pub(crate) fn preprocess(
    plugin: &LoadedPlugin,
    config: &ModelConfig,
    modality: Modality,
    bytes: &[u8],
) -> Result<Preprocessed> {
    let options = preprocess_options(&plugin.manifest().limits, Detail::Full);
    preprocess_with(plugin, config, modality, bytes, &options, MAX_INPUT_PIXELS)
}

/// [`preprocess`] with `options`, refusing an image whose header declares more than
/// `max_input_pixels` before any pixel buffer exists.
fn preprocess_with(
    plugin: &LoadedPlugin,
    config: &ModelConfig,
    modality: Modality,
    bytes: &[u8],
    options: &PreprocessOptions,
    max_input_pixels: u64,
) -> Result<Preprocessed> {
    let encoded = match modality {
        Modality::Image => {
            match decode_image(bytes, max_input_pixels) {
                Ok(rgb) => match plugin.preprocess(config, &rgb, options) {
                    Err(PluginApiError::Plugin { error, .. }) if error.code == ErrorCode::Unsupported => {}
                    other => return Ok(other?),
                },
                Err(mlxcel_media::Error::Unrecognized) => {}
                Err(refused) => return Err(refused.into()),
            }
            MediaItem::EncodedImage(bytes.to_vec().into())
        }
        Modality::Audio | Modality::Video => MediaItem::EncodedAudio(bytes.to_vec().into()),
    };
    let preprocessed = plugin.preprocess(config, &encoded, options);
    if modality == Modality::Image && mlxcel_media::Format::sniff(bytes).is_none() {
        return preprocessed.context(
            "not an image in a format the host decodes (png, jpeg, webp, gif), and the plugin did not take the bytes",
        );
    }
    Ok(preprocessed?)
}

/// Decodes an image to 8-bit RGB as transformers' `load_image` does (`mlxcel_media`: the
/// EXIF orientation applied, alpha dropped, grey and palettes expanded).
pub(crate) fn decode_image(bytes: &[u8], max_pixels: u64) -> Result<MediaItem, mlxcel_media::Error> {
    let image = mlxcel_media::decode_limited(bytes, max_pixels)?;
    let (width, height) = (image.width(), image.height());
    Ok(MediaItem::Rgb8 { width, height, pixels: image.into_pixels().into() })
}

/// The plugin's encoder graphs compiled per bucket and run on a checkpoint's weights; each
/// bucket is compiled and loaded on first use.
pub(crate) struct Encoders<'a> {
    checkpoint: PathBuf,
    device_args: &'a DeviceArgs,
    /// What the encoders compute in: the decoder's activations and sums.
    compute: EncoderCompute,
    device: Option<Device>,
    /// Per parameter scope and alias set (one per encoder's weights).
    parameters: HashMap<(String, BTreeMap<String, String>), Parameters>,
    sessions: HashMap<String, (EncoderGraph, Session)>,
}

impl<'a> Encoders<'a> {
    /// Encoders of `checkpoint` beside a decoder computing under `decoder` (`None`: f32).
    pub(crate) fn new(
        checkpoint: &Path,
        device_args: &'a DeviceArgs,
        decoder: Option<&mlxcel_emit::NumericContract>,
    ) -> Self {
        Self {
            checkpoint: checkpoint.to_owned(),
            device_args,
            compute: encoder_compute(decoder),
            device: None,
            parameters: HashMap::new(),
            sessions: HashMap::new(),
        }
    }

    /// One item through the smallest bucket that holds it: the rows of `output` (else the first
    /// output) that belong to the item, flattened.
    pub(crate) fn encode(
        &mut self,
        plugin: &LoadedPlugin,
        config: &ModelConfig,
        modality: Modality,
        item: &Preprocessed,
        output: Option<&str>,
    ) -> Result<Vec<f32>> {
        let mut outputs = self.encode_all(plugin, config, modality, item)?;
        let name = match output {
            Some(name) => name.to_owned(),
            None => outputs.first().map(|(n, _)| n.clone()).context("the encoder declares no outputs")?,
        };
        let at = outputs
            .iter()
            .position(|(n, _)| *n == name)
            .with_context(|| format!("the contract places output `{name}`, which the graph does not have"))?;
        Ok(outputs.swap_remove(at).1)
    }

    /// One item through the smallest bucket that holds it, once: every output's rows that
    /// belong to the item, flattened, in the graph's output order.
    pub(crate) fn encode_all(
        &mut self,
        plugin: &LoadedPlugin,
        config: &ModelConfig,
        modality: Modality,
        item: &Preprocessed,
    ) -> Result<Vec<(String, Vec<f32>)>> {
        let bucket = smallest_bucket(plugin.encoder_buckets(config, modality)?, item)?;
        self.start(plugin, config, modality, &bucket, item)?.finish()
    }

    /// Starts one item through `bucket` (which holds it: [`smallest_bucket`]) and returns
    /// without waiting: the encoder graphs are compiled with IREE's asynchronous ABI, so this
    /// device's own workers run the encoder while the caller (the engine thread) goes on
    /// decoding. The bucket is compiled and loaded first if this is its first use, which does
    /// wait.
    pub(crate) fn start(
        &mut self,
        plugin: &LoadedPlugin,
        config: &ModelConfig,
        modality: Modality,
        bucket: &ShapeBucket,
        item: &Preprocessed,
    ) -> Result<Encoding> {
        let (graph, session) = self.session(plugin, config, modality, bucket)?;

        let mut inputs = Vec::new();
        for spec in graph.inputs.iter() {
            let tensor =
                item.tensors.iter().find(|t| t.spec.name == spec.name).with_context(|| {
                    format!("the encoder input `{}` is not among the preprocessed tensors", spec.name)
                })?;
            let shape: Vec<usize> = spec.shape.iter().map(|&d| d as usize).collect();
            inputs.push(HostTensor::from_bytes(shim_dtype(spec.dtype), shape, pad(tensor, &spec.shape))?);
        }
        let entry = graph.entry_function.as_str();
        let function = session
            .functions()
            .iter()
            .find(|f| f.name == entry || f.name.rsplit_once('.').is_some_and(|(_, name)| name == entry))
            .with_context(|| format!("the compiled encoder exports no function `{entry}`"))?
            .name
            .clone();
        let args: Vec<Arg<'_>> = inputs.iter().map(Arg::from).collect();
        let invocation = session.start(&function, &args)?;
        Ok(Encoding {
            invocation,
            outputs: graph.outputs.iter().map(|spec| spec.name.to_string()).collect(),
            rows: item.grid.feature_tokens as usize,
        })
    }

    /// Compiles (or takes from the compile cache) and loads every bucket of the plugin's
    /// `modality` encoder, so that no request waits for one: what `mlxcel-host compile` builds
    /// ahead and `serve --warm-encoders` does before it listens.
    pub(crate) fn warm(&mut self, plugin: &LoadedPlugin, config: &ModelConfig, modality: Modality) -> Result<usize> {
        let buckets = plugin.encoder_buckets(config, modality)?;
        for bucket in buckets.iter() {
            self.session(plugin, config, modality, bucket)?;
        }
        Ok(buckets.len())
    }

    /// The compiled and loaded encoder of one bucket, made on first use.
    fn session(
        &mut self,
        plugin: &LoadedPlugin,
        config: &ModelConfig,
        modality: Modality,
        bucket: &ShapeBucket,
    ) -> Result<&(EncoderGraph, Session)> {
        let key = format!("{}/{}/{}", plugin.name(), modality.as_str(), bucket.id);
        if !self.sessions.contains_key(&key) {
            let request = EncoderGraphRequest { modality, bucket: bucket.id.clone() };
            // The plugin lays the graph's weights out for this CPU's vectors (a layout only).
            let vector_bits = Target::Cpu { cpu: self.device_args.target_cpu.clone() }.vector_bits();
            let graph = plugin.encoder_graph(config, &request, &EncoderTarget::new(vector_bits), self.compute)?;
            let name = format!("{}-{}-{}", plugin.name(), modality.as_str(), bucket.id);
            let record = self.compute.contract().for_vectors(vector_bits).for_many_rows();
            let mut flags = ENCODER_FLAGS.map(String::from).to_vec();
            flags.extend(mlxcel_host::decoder::contract_flags(&record));
            // The contract the plugin emitted under, over the dtypes the graph declares its
            // weights in (f32: a bf16 or f16 checkpoint's weights widened inside the graph).
            let mut sources: Vec<String> =
                graph.parameters.iter().map(|p| format!("{:?}", p.dtype).to_lowercase()).collect();
            sources.sort();
            sources.dedup();
            let contract = (record, sources);
            let artifact = compile(&name, &graph.stablehlo, &flags, Some(contract), self.device_args)?;
            if self.device.is_none() {
                let driver: Driver = self.device_args.driver.parse()?;
                self.device = Some(Device::new(driver)?);
            }
            let device = self.device.as_ref().context("invariant: the device was just made")?;
            // The graph names its weights logically (`label/path`); the one resolver finds the
            // checkpoint key of each, and IREE serves the tensor under that name.
            let checkpoint = Checkpoint::open(&self.checkpoint)?;
            let aliases =
                resolve_names(&checkpoint_index(&checkpoint), graph.parameters.iter().map(|p| p.name.as_str()))
                    .with_context(|| {
                        format!("the {} encoder's weights in {}", plugin.name(), self.checkpoint.display())
                    })?;
            // An MLX checkpoint's convolution kernels are stored channels-last: served
            // transposed into the layout the graph declares.
            let derived = self.device_args.cache_dir.clone().unwrap_or_else(CompileCache::default_dir).join("derived");
            let (checkpoint, aliases) = crate::layout::serve_declared(checkpoint, aliases, &graph.parameters, &derived)
                .with_context(|| format!("the {} encoder's weights in {}", plugin.name(), self.checkpoint.display()))?;
            let scope = (graph.parameter_scope.to_string(), aliases);
            if !self.parameters.contains_key(&scope) {
                let parameters = Parameters::with_aliases(&scope.0, checkpoint, scope.1.clone())?;
                self.parameters.insert(scope.clone(), parameters);
            }
            let session = Session::new(device, self.parameters.get(&scope), &[&artifact])?;
            self.sessions.insert(key.clone(), (graph, session));
        }
        self.sessions.get(&key).context("invariant: the session was just made")
    }
}

/// One item's encoder call, running on the encoders' device ([`Encoders::start`]).
pub(crate) struct Encoding {
    invocation: Invocation,
    /// The graph's output names, in order.
    outputs: Vec<String>,
    /// The item's feature rows (a bucket may hold more).
    rows: usize,
}

impl Encoding {
    /// Whether the device has finished, without waiting.
    pub(crate) fn is_done(&self) -> Result<bool> {
        Ok(self.invocation.is_done()?)
    }

    /// Waits up to `timeout` for the device; whether it has finished.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<bool> {
        Ok(self.invocation.wait(timeout)?)
    }

    /// Waits for the device, then reads every output's rows that belong to the item, flattened,
    /// in the graph's output order.
    pub(crate) fn finish(self) -> Result<Vec<(String, Vec<f32>)>> {
        let Encoding { invocation, outputs: names, rows } = self;
        let outputs = invocation.finish()?;
        if outputs.len() < names.len() {
            bail!("the encoder returned {} outputs; its graph declares {}", outputs.len(), names.len());
        }
        let mut named = Vec::with_capacity(names.len());
        for (name, output) in names.into_iter().zip(&outputs) {
            let host = output.to_host()?;
            let values: Vec<f32> = host.to_vec()?;
            let shape = host.shape().to_vec();
            let width: usize = shape.iter().skip(1).product();
            if shape.first().copied().unwrap_or(0) < rows {
                bail!("the encoder output `{name}` has shape {shape:?}, fewer than the item's {rows} feature rows");
            }
            let values = &values[..rows * width];
            // A NaN here would reach every logit its rows touch; the request fails here instead,
            // naming the output, rather than at the sampler.
            if let Some(at) = values.iter().position(|v| v.is_nan()) {
                bail!(
                    "the encoder output `{name}` holds NaN at row {}, column {} of the item's {rows} rows",
                    at / width.max(1),
                    at % width.max(1)
                );
            }
            named.push((name, values.to_vec()));
        }
        Ok(named)
    }
}

/// The smallest of `buckets` (by input elements) that holds `item`.
fn smallest_bucket(buckets: Vec<ShapeBucket>, item: &Preprocessed) -> Result<ShapeBucket> {
    buckets
        .into_iter()
        .filter(|b| fits(b.inputs.as_slice(), item))
        .min_by_key(|b| b.inputs.iter().map(|s| s.element_count().unwrap_or(u64::MAX)).sum::<u64>())
        .with_context(|| {
            let shapes: Vec<String> =
                item.tensors.iter().map(|t| format!("{} {:?}", t.spec.name, t.spec.shape.as_slice())).collect();
            format!("no encoder bucket holds {}", shapes.join(", "))
        })
}

/// Whether `item` has a tensor for each bucket input, of its dtype and rank and no larger.
fn fits(inputs: &[TensorSpec], item: &Preprocessed) -> bool {
    inputs.iter().all(|spec| {
        item.tensors.iter().any(|t| {
            t.spec.name == spec.name
                && t.spec.dtype == spec.dtype
                && t.spec.shape.len() == spec.shape.len()
                && t.spec.shape.iter().zip(spec.shape.iter()).all(|(have, room)| have <= room)
        })
    })
}

/// The tensor's bytes zero-padded at the end of every axis to `to`.
fn pad(tensor: &Tensor, to: &[u64]) -> Vec<u8> {
    let from: Vec<usize> = tensor.spec.shape.iter().map(|&d| d as usize).collect();
    let to: Vec<usize> = to.iter().map(|&d| d as usize).collect();
    if from == to || from.is_empty() {
        return tensor.data.to_vec();
    }
    let size = tensor.spec.dtype.size();
    let rank = from.len();
    let mut strides = vec![1usize; rank];
    for axis in (0..rank - 1).rev() {
        strides[axis] = strides[axis + 1] * to[axis + 1];
    }
    let row = from[rank - 1] * size;
    let outer: usize = from[..rank - 1].iter().product();
    let mut out = vec![0u8; to.iter().product::<usize>() * size];
    for o in 0..outer {
        let (mut rest, mut offset) = (o, 0);
        for axis in (0..rank - 1).rev() {
            offset += (rest % from[axis]) * strides[axis];
            rest /= from[axis];
        }
        out[offset * size..offset * size + row].copy_from_slice(&tensor.data[o * row..(o + 1) * row]);
    }
    out
}

pub(crate) fn shim_dtype(dtype: DType) -> mlxcel_shim::DType {
    match dtype {
        DType::F32 => mlxcel_shim::DType::F32,
        DType::F16 => mlxcel_shim::DType::F16,
        DType::BF16 => mlxcel_shim::DType::BF16,
        DType::I32 => mlxcel_shim::DType::I32,
        DType::I64 => mlxcel_shim::DType::I64,
        DType::U8 => mlxcel_shim::DType::U8,
        DType::Bool => mlxcel_shim::DType::Bool,
    }
}

/// Refuses a contract whose `text_scale` is not the checkpoint decoder's own embedding scale: the
/// merge applies `text_scale` once to the decoder's raw rows, and the token path (text-only
/// prompts, decode) applies the decoder's scale, so anything else would scale the prompt's text
/// differently from the text the model generates.
fn check_text_scale(text_scale: f32, decoder_scale: f32, plugin: &str) -> Result<()> {
    if text_scale.to_bits() != decoder_scale.to_bits() {
        bail!(
            "the {plugin} plugin's contract scales text embeddings by {text_scale}, but the checkpoint's decoder \
             scales its token embeddings by {decoder_scale}; they must be equal"
        );
    }
    Ok(())
}

/// The contract's positions as the decoder takes them.
fn positions(laid: &Laid, n: usize) -> Result<Positions> {
    if laid.len() != n {
        bail!("the contract has {} positions for a prompt of {n} tokens", laid.len());
    }
    let narrow = |ids: &[i64]| -> Result<Vec<i32>> {
        ids.iter().map(|&p| i32::try_from(p).map_err(|_| anyhow!("position {p} does not fit i32"))).collect()
    };
    let (ids, next) = match laid {
        Laid::OneD { ids, next_position } => (ids.as_slice(), *next_position),
        Laid::MRope { ids, next_position, .. } => (ids.as_slice(), *next_position),
    };
    // The decoder continues from the largest position plus one; the contract must agree.
    let largest = ids.iter().copied().max().unwrap_or(-1);
    if next != largest + 1 {
        bail!("the contract continues decoding at {next}, not after its largest position {largest}");
    }
    Ok(match laid {
        Laid::OneD { .. } => Positions::OneD(narrow(ids)?),
        Laid::MRope { .. } => Positions::MRope([narrow(&ids[..n])?, narrow(&ids[n..2 * n])?, narrow(&ids[2 * n..])?]),
    })
}

/// The contract's mask as the decoder's extras: causal plus groups of runs whose rows see each
/// other. The allowing blocks must tile each group exactly: a run's block with itself, and one
/// block for every ordered pair of runs of a group (the reference's "same block id" overlay,
/// where one id may mark runs apart); any other block (a denial, a rectangle that is not a
/// pair of whole runs, a pair missing from its group) is one the decoder cannot apply.
fn bidirectional(contract: &PrefillProgram) -> Result<Vec<Vec<std::ops::Range<usize>>>> {
    match contract.mask.base {
        MaskBase::Causal => {}
    }
    let range = |start: u32, len: u32| start as usize..(start as usize + len as usize);
    let cannot =
        |b: &mlxcel_plugin_api::MaskBlock| anyhow!("the contract's mask has a block the decoder cannot apply: {b:?}");
    // The runs: every square block on the diagonal.
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for b in contract.mask.blocks.iter() {
        if !b.allow {
            return Err(cannot(b));
        }
        if b.row_start == b.col_start && b.rows == b.cols && !runs.contains(&range(b.row_start, b.rows)) {
            runs.push(range(b.row_start, b.rows));
        }
    }
    runs.sort_by_key(|r| r.start);
    // Groups: runs joined by an off-diagonal block, union-find over run indices.
    let mut parent: Vec<usize> = (0..runs.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            i = parent[i];
        }
        i
    }
    let mut pairs = std::collections::BTreeSet::new();
    for b in contract.mask.blocks.iter() {
        let (Some(r), Some(c)) = (
            runs.iter().position(|x| *x == range(b.row_start, b.rows)),
            runs.iter().position(|x| *x == range(b.col_start, b.cols)),
        ) else {
            return Err(cannot(b));
        };
        pairs.insert((r, c));
        let (a, z) = (root(&mut parent, r), root(&mut parent, c));
        parent[a] = z;
    }
    let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = std::collections::BTreeMap::new();
    for i in 0..runs.len() {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    for members in groups.values() {
        for &r in members {
            for &c in members {
                if !pairs.contains(&(r, c)) {
                    bail!(
                        "the contract's mask joins the runs {:?} and {:?} but lets {:?} not see {:?}; the decoder \
                         applies groups of runs that all see each other",
                        runs[members[0]],
                        runs[members[members.len() - 1]],
                        runs[r],
                        runs[c]
                    );
                }
            }
        }
    }
    Ok(groups.into_values().map(|members| members.into_iter().map(|i| runs[i].clone()).collect()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(blocks: &[(u32, u32, u32, u32, bool)]) -> PrefillProgram {
        let mut mask = mlxcel_plugin_api::AttentionMask::causal();
        for &(row_start, rows, col_start, cols, allow) in blocks {
            mask.blocks.push(mlxcel_plugin_api::MaskBlock { row_start, rows, col_start, cols, allow });
        }
        PrefillProgram {
            text_scale: 1.0,
            placements: Default::default(),
            injections: Default::default(),
            positions: mlxcel_plugin_api::Positions::sequential(40),
            mask,
        }
    }

    #[test]
    fn mask_blocks_become_groups_of_runs_that_all_see_each_other() {
        // Gemma 3: one square block per image, one group each.
        let two = bidirectional(&program(&[(2, 4, 2, 4, true), (10, 3, 10, 3, true)])).expect("squares");
        assert_eq!(two, vec![vec![2..6], vec![10..13]]);
        // Molmo2: every ordered pair of two runs, one group.
        let pairs = [(2, 4, 2, 4, true), (2, 4, 10, 3, true), (10, 3, 2, 4, true), (10, 3, 10, 3, true)];
        assert_eq!(bidirectional(&program(&pairs)).expect("pairs"), vec![vec![2..6, 10..13]]);
        // A pair missing from a joined group, a denial, a rectangle of no whole runs: refused.
        let err = bidirectional(&program(&pairs[..3])).expect_err("10..13 is no run").to_string();
        assert!(err.contains("cannot apply"), "{err}");
        let one_way = [(2, 4, 2, 4, true), (10, 3, 10, 3, true), (2, 4, 10, 3, true)];
        let err = bidirectional(&program(&one_way)).expect_err("one way").to_string();
        assert!(err.contains("lets 10..13 not see 2..6"), "{err}");
        assert!(bidirectional(&program(&[(2, 4, 2, 4, false)])).is_err(), "a denial");
        assert!(bidirectional(&program(&[(2, 4, 2, 4, true), (2, 2, 2, 4, true)])).is_err(), "part of a run");
    }

    fn plugin_error(code: ErrorCode) -> anyhow::Error {
        let error = mlxcel_plugin_api::PluginError::new(code, "what the plugin said");
        anyhow::Error::new(PluginApiError::Plugin { plugin: "fam".into(), entry: "preprocess", error })
            .context("image 1")
    }

    #[test]
    fn a_media_failure_is_the_inputs_or_ours_by_what_caused_it() {
        for (code, fault) in [
            (ErrorCode::InvalidArgument, Fault::Input),
            (ErrorCode::Unsupported, Fault::Input),
            (ErrorCode::ResourceExhausted, Fault::Input),
            (ErrorCode::Internal, Fault::Server),
            (ErrorCode::Panicked, Fault::Server),
        ] {
            // The plugin's own code wins over the step's default, either way.
            assert_eq!(MediaError::classify(plugin_error(code), Fault::Input).fault, fault, "{code:?}");
            assert_eq!(MediaError::classify(plugin_error(code), Fault::Server).fault, fault, "{code:?}");
        }
        let not_an_image = anyhow::Error::new(mlxcel_media::Error::Unrecognized).context("image 2");
        assert_eq!(MediaError::classify(not_an_image, Fault::Server).fault, Fault::Input);
        let boundary = anyhow::Error::new(PluginApiError::BadConfig { reason: "x".into() });
        assert_eq!(MediaError::classify(boundary, Fault::Input).fault, Fault::Server);
        // An encoder that did not compile: nothing in the chain names the input.
        let compile = anyhow!("compiling the encoder failed");
        assert_eq!(MediaError::classify(compile, Fault::Server).fault, Fault::Server);
        let shown = MediaError::classify(plugin_error(ErrorCode::Internal), Fault::Server).to_string();
        assert!(shown.starts_with("image 1: plugin `fam` failed in preprocess"), "{shown}");
    }

    #[test]
    fn a_text_scale_other_than_the_decoders_own_is_refused_naming_both() {
        assert!(check_text_scale(8.0, 8.0, "fam").is_ok());
        assert!(check_text_scale(1.0, 1.0, "other").is_ok());
        let err = check_text_scale(1.0, 8.0, "fam").expect_err("missing scale").to_string();
        assert_eq!(
            err,
            "the fam plugin's contract scales text embeddings by 1, but the checkpoint's decoder scales its token \
             embeddings by 8; they must be equal"
        );
        let err = check_text_scale(8.0, 1.0, "acme").expect_err("a scale the decoder does not have").to_string();
        assert!(err.contains("by 8, but the checkpoint's decoder scales its token embeddings by 1"), "{err}");
    }

    /// A Hub checkpoint may keep the image processor in `preprocessor_config.json` and only the
    /// processor's own fields in `processor_config.json`; both are read.
    #[test]
    fn the_processor_config_is_found_nested_or_split_over_both_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, json: &str| std::fs::write(dir.path().join(name), json).expect("write");
        assert_eq!(processor_json(dir.path()).expect("none"), "");
        write("processor_config.json", r#"{"image_seq_length": 256, "processor_class": "AcmeProcessor"}"#);
        write("preprocessor_config.json", r#"{"size": {"height": 896, "width": 896}, "image_seq_length": 256}"#);
        let merged: serde_json::Value =
            serde_json::from_str(&processor_json(dir.path()).expect("split")).expect("json");
        assert_eq!((merged["size"]["height"].as_u64(), merged["image_seq_length"].as_u64()), (Some(896), Some(256)));
        write("preprocessor_config.json", r#"{"image_seq_length": 64}"#);
        let err = processor_json(dir.path()).expect_err("disagreeing files").to_string();
        assert!(err.contains("disagree on `image_seq_length`"), "{err}");
        write("processor_config.json", r#"{"image_processor": {"resample": 2}}"#);
        let nested: serde_json::Value =
            serde_json::from_str(&processor_json(dir.path()).expect("nested")).expect("json");
        assert_eq!(
            nested,
            serde_json::json!({"image_processor": {"resample": 2}}),
            "transformers 5's nested form wins"
        );
    }

    #[test]
    fn digests_differ_by_bytes_and_by_every_part_of_the_encoder_identity() {
        let parts = ["qwen2_vl", "ab12", "summary", "{\"patch\":14}", "max_pixels: 1000", "weights-1"];
        let identity = identity_of(&parts);
        let (png, other) = (b"an image".as_slice(), b"another image".as_slice());
        assert_eq!(media_digest(&identity, png), media_digest(&identity_of(&parts), png), "the same bytes hit");
        assert_ne!(media_digest(&identity, png), media_digest(&identity, other), "other bytes miss");
        for i in 0..parts.len() {
            let mut changed = parts;
            changed[i] = "changed";
            assert_ne!(media_digest(&identity_of(&changed), png), media_digest(&identity, png), "part {i}");
        }
        // Parts are length-prefixed: moving a boundary changes the identity.
        assert_ne!(identity_of(&["ab", "c"]), identity_of(&["a", "bc"]));
    }

    /// Issue 29: `detail: "low"` is preprocessed within the manifest's low-detail budget where the
    /// family declares one, so its digest (the encoder cache's key, the prefix cache's row name)
    /// is another than the same bytes' at full detail; without one, `low` is `high`.
    #[test]
    fn low_detail_is_its_own_budget_and_identity_only_where_the_manifest_declares_one() {
        let options_digest = |limits: &Limits, detail| {
            let options = preprocess_options(limits, detail);
            let identity = identity_of(&["qwen2_vl", "summary", &format!("{options:?}")]);
            (options.max_pixels.into_option(), media_digest(&identity, b"an image"))
        };
        let declared = Limits {
            max_pixels_per_image: Some(1_003_520),
            low_detail_max_pixels: Some(262_144),
            ..Default::default()
        };
        let (full, full_digest) = options_digest(&declared, Detail::Full);
        let (low, low_digest) = options_digest(&declared, Detail::Low);
        assert_eq!((full, low), (Some(1_003_520), Some(262_144)));
        assert_ne!(full_digest, low_digest, "a low item never reuses a high item's features or rows");

        let fixed = Limits { max_pixels_per_image: Some(802_816), ..Default::default() };
        assert_eq!(options_digest(&fixed, Detail::Low), options_digest(&fixed, Detail::Full), "one resolution");

        // A budget alone bounds `low`; one over the limit (which validation refuses) never loosens it.
        let budget_only = Limits { low_detail_max_pixels: Some(262_144), ..Default::default() };
        assert_eq!(options_digest(&budget_only, Detail::Low).0, Some(262_144));
        assert_eq!(options_digest(&budget_only, Detail::Full).0, None);
        let over = Limits { max_pixels_per_image: Some(1000), low_detail_max_pixels: Some(2000), ..Default::default() };
        assert_eq!(options_digest(&over, Detail::Low).0, Some(1000));
    }

    #[test]
    fn padding_places_each_row_at_the_start_of_the_larger_shape() {
        let tensor = Tensor::from_f32("x", &[2, 2], &[1.0, 2.0, 3.0, 4.0]).expect("tensor");
        let padded = pad(&tensor, &[3, 3]);
        let values: Vec<f32> = padded.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(values, [1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(pad(&tensor, &[2, 2]), tensor.data.to_vec());
    }
}
