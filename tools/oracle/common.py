"""Shared machinery for the reference oracle: tiny checkpoints and per-stage golden tensors.

Every family script (`gen_<family>.py`) builds a tiny random-weight model in the exact Hugging Face layout,
writes it to `tests/fixtures/<name>/`, reloads it from disk, and records golden tensors for each prompt
variant from the *reloaded* checkpoint, so whatever the Rust side loads is exactly what produced the goldens.

Layout of one fixture directory:

    config.json, generation_config.json, model.safetensors,     the checkpoint (fp32, one shard)
    tokenizer.json, tokenizer_config.json, chat_template.jinja,
    processor_config.json (VLMs)
    inputs/<image>.png                                          images the prompts refer to (.jpg, .webp: files
                                                                as clients send them, see client_formats)
    goldens/<variant>.safetensors                               tensors per stage (batch dimension dropped)
    goldens/<variant>.json                                      ints, text and metadata for that variant
    provenance.json                                             reference, versions, seed, command

Run a family script with `--check` to recompute every golden from the committed fixture without writing
anything; `check.py` says what it compares exactly and which bound each float gets (another CPU makes
torch pick other kernels, so floats move in their last bits while tokens do not).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save as st_save

import check as fixture_check
from check import Mismatch  # noqa: F401  (raised to the family scripts' callers)

# Everything is local: never let transformers reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
# MLXCEL_ORACLE_FIXTURES points the scripts at a copy (the check's own test perturbs one).
FIXTURES = Path(os.environ.get("MLXCEL_ORACLE_FIXTURES", REPO / "tests" / "fixtures")).resolve()

SEED = 1234
# Prefill chunk the decoder issue (#5) compiles for; the "long" variants are longer than one chunk.
PREFILL_CHUNK = 32
GREEDY_TOKENS = 16
# The byte-level BPE base every tiny tokenizer shares; family special tokens follow at ids >= BASE_VOCAB.
BASE_VOCAB = 384
GOLDEN_FORMAT = 1
# Greedy tokens are only a fair test when the top-1/top-2 gap along the path is well above the f32 logits
# tolerance (1e-4); a variant below this fails loudly so its prompt can be changed.
MIN_GREEDY_MARGIN = 5e-4

# Prompts shared by the families, so fixtures are comparable across them.
SHORT_PROMPT = "Describe this image."
TEXT_PROMPT = "Say hello."
LONG_HEAD = "You are looking at a small synthetic test picture made of colour gradients and a checkerboard."
LONG_TAIL = " Explain which colours appear in each corner."
LONG_PROMPT = LONG_HEAD + LONG_TAIL
TWO_IMAGE_PROMPT = "Compare the two pictures."

# A fixed training corpus written for this project, so tokenizers never depend on downloaded text or on the
# Python version's own files.
_CORPUS = """
The oracle builds tiny models with random weights and records what the reference computes at every stage.
A picture goes through the processor, the vision encoder, the projector, and then into the language model.
Each stage is written down as a tensor so that another implementation can find the first place it differs.
Small models run in milliseconds, which keeps the whole check fast enough to run on every change.
The tokenizer is trained on this text only; it knows a few hundred pieces of English and every byte.
Describe this image. What is in this picture? Compare the two pictures. Write a short sentence about the sea.
The sea was calm and grey in the morning, and the boats left the harbour one after another.
Colours, corners, squares, gradients, lines and shapes: a careful reader notices the edges first.
Explain step by step which colours appear in each corner and where the pattern changes.
Numbers such as 1, 2, 3, 10, 42 and 2024 appear in text too, and so do punctuation marks like ; : ! ?
Models read tokens, attend to earlier tokens, and predict the next one, greedily or by sampling.
A key and value cache keeps the work of earlier tokens so that decoding a new token is cheap.
Positions tell the model where each token sits; images use three coordinates: time, height and width.
The user asks, the assistant answers, and the system sets the scene for the conversation.
"""


# ----------------------------------------------------------------------------------------------------------
# environment


def setup_torch() -> None:
    """One thread and deterministic kernels: the goldens must be byte-identical run to run."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    np.random.seed(SEED)


def versions(*extra: str) -> dict[str, str]:
    import importlib.metadata as md

    names = ["torch", "transformers", "tokenizers", "safetensors", "pillow", "numpy", "torchvision", *extra]
    out = {"python": sys.version.split()[0]}
    for n in names:
        out[n] = md.version(n)
    return out


def parse_args(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--check", action="store_true", help="recompute goldens from the committed fixture, write nothing")
    return ap.parse_args()


# ----------------------------------------------------------------------------------------------------------
# tokenizer


def build_tokenizer(specials: list[str]):
    """A byte-level BPE with exactly BASE_VOCAB ids (Qwen2 split regex) plus `specials` at BASE_VOCAB + i."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+"
    )
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([line for line in _CORPUS.splitlines() if line], trainer=trainer)
    if tok.get_vocab_size() != BASE_VOCAB:
        raise RuntimeError(f"base vocab is {tok.get_vocab_size()}, expected {BASE_VOCAB}: grow the corpus")
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    for i, s in enumerate(specials):
        assert tok.token_to_id(s) == BASE_VOCAB + i, s
    return tok


def hf_tokenizer(specials: list[str], chat_template: str | None = None, **named_tokens: str):
    """Wrap `build_tokenizer(specials)` as a transformers tokenizer.

    Any `<name>_token` keyword becomes a named attribute (eos_token, image_token, boi_token, ...), which some
    processors read."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(specials), **named_tokens)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def special_ids(specials: list[str]) -> dict[str, int]:
    return {s: BASE_VOCAB + i for i, s in enumerate(specials)}


# ----------------------------------------------------------------------------------------------------------
# weights and inputs


def randomize(model: torch.nn.Module, seed: int = SEED + 1, vec_std: float = 0.1) -> torch.nn.Module:
    """Redraw every float parameter so each stage is O(1) and no tensor is constant.

    Matrices, embeddings and convolutions get N(0, 1/fan_in). Vectors (norm weights, biases, scalars) keep
    their default value plus N(0, vec_std) noise, so LayerNorm weights stay near 1 and Gemma's (1 + w) weights
    near 0. Default initialisations would hide bugs: zero projectors (Gemma3), norms exactly 1, biases exactly
    0, and std-0.02 attention that is nearly uniform (hiding RoPE and mask errors)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if not p.is_floating_point():
                continue
            if p.dim() >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / fan_in**0.5)
            else:
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * vec_std)
    return model.eval()


def synthetic_image(width: int, height: int, kind: int = 0) -> Image.Image:
    """A deterministic RGB picture: gradients plus a checkerboard, so resizing has real edges to blur."""
    y, x = np.mgrid[0:height, 0:width]
    r = (x * 255 // max(width - 1, 1)).astype(np.uint8)
    g = (y * 255 // max(height - 1, 1)).astype(np.uint8)
    cell = 7 + 2 * kind
    b = ((((x // cell) + (y // cell)) % 2) * 200 + 25).astype(np.uint8)
    if kind % 2 == 1:
        r, b = b, 255 - r
    return Image.fromarray(np.stack([r, g, b], -1), "RGB")


def save_image(img: Image.Image, fixture: Path, name: str) -> str:
    rel = f"inputs/{name}.png"
    (fixture / "inputs").mkdir(parents=True, exist_ok=True)
    img.save(fixture / rel, format="PNG", optimize=False, compress_level=9)
    return rel


def load_image(fixture: Path, rel: str) -> Image.Image:
    """The image as transformers' `load_image` gives it for the file: Pillow opens it,
    `ImageOps.exif_transpose` applies its orientation, `convert("RGB")`."""
    from transformers.image_utils import load_image as reference_load_image

    return reference_load_image(str(fixture / rel))


@dataclass(frozen=True)
class EncodedImage:
    """An image file as clients send it (a JPEG, a WebP, a phone's EXIF orientation): written to inputs/ byte
    for byte and read back with transformers' `load_image`, as the reference reads a file."""

    ext: str
    data: bytes


def save_encoded(img: EncodedImage, fixture: Path, name: str) -> str:
    rel = f"inputs/{name}.{img.ext}"
    (fixture / "inputs").mkdir(parents=True, exist_ok=True)
    (fixture / rel).write_bytes(img.data)
    return rel


def client_formats(picture: Image.Image, stem: str) -> tuple[dict[str, EncodedImage], list["Variant"]]:
    """`picture` as a client would send it: a JPEG (4:2:0, the encoders' default), a lossy WebP, and a JPEG
    stored a quarter turn off with EXIF orientation 6 (what a phone writes; `load_image` turns it upright).
    Returns the media by name and one single-image variant for each."""
    import io

    def encoded(im: Image.Image, fmt: str, **options: Any) -> bytes:
        buf = io.BytesIO()
        im.save(buf, fmt, **options)
        return buf.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6
    media = {
        f"{stem}_jpeg": EncodedImage("jpg", encoded(picture, "JPEG", quality=90, subsampling=2)),
        f"{stem}_webp": EncodedImage("webp", encoded(picture, "WEBP", quality=80)),
        f"{stem}_exif": EncodedImage("jpg", encoded(picture.transpose(Image.Transpose.ROTATE_90), "JPEG",
                                                    quality=90, subsampling=2, exif=exif.tobytes())),
    }
    variants = [
        Variant("image_jpeg", f"one image sent as a JPEG ({stem}, 4:2:0, quality 90)",
                [("image", f"{stem}_jpeg"), SHORT_PROMPT]),
        Variant("image_webp", f"one image sent as a lossy WebP ({stem}, quality 80)",
                [("image", f"{stem}_webp"), SHORT_PROMPT]),
        Variant("image_jpeg_exif", f"one JPEG stored a quarter turn off with EXIF orientation 6 ({stem} upright)",
                [("image", f"{stem}_exif"), SHORT_PROMPT]),
    ]
    return media, variants


AUDIO_RATE = 16000


def synthetic_audio(seconds: float, low_hz: float = 200.0, high_hz: float = 2000.0) -> np.ndarray:
    """A deterministic chirp plus a faint tone, as int16 samples at AUDIO_RATE (what a WAV file stores)."""
    t = np.arange(int(seconds * AUDIO_RATE)) / AUDIO_RATE
    sweep = np.sin(2 * np.pi * (low_hz + (high_hz - low_hz) / (2 * seconds) * t) * t)
    wave = 0.5 * sweep + 0.05 * np.sin(2 * np.pi * 3000 * t)
    return np.round(wave * 32767).astype(np.int16)


def save_audio(samples: np.ndarray, fixture: Path, name: str) -> str:
    import wave

    rel = f"inputs/{name}.wav"
    (fixture / "inputs").mkdir(parents=True, exist_ok=True)
    with wave.open(str(fixture / rel), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(AUDIO_RATE)
        w.writeframes(samples.astype("<i2").tobytes())
    return rel


def load_audio(fixture: Path, rel: str) -> np.ndarray:
    """Mono 16-bit WAV -> float32 in [-1, 1) (samples / 32768), the form the feature extractor receives."""
    import wave

    with wave.open(str(fixture / rel), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, AUDIO_RATE), rel
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return data.astype(np.float32) / 32768.0


# ----------------------------------------------------------------------------------------------------------
# running the reference


@dataclass
class Captured:
    """What the decoder stack received during one full-sequence forward."""

    inputs_embeds: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    masks: dict[str, torch.Tensor] = field(default_factory=dict)


def capture_decoder_inputs(text_model: torch.nn.Module, layer_types: list[str] | None):
    """Hooks recording the decoder's inputs_embeds and position_ids and each layer type's attention mask.

    Returns (captured, remove)."""
    cap = Captured()
    handles = []

    def on_text_model(_mod, args, kwargs):
        if cap.inputs_embeds is not None:
            return
        emb = kwargs.get("inputs_embeds")
        if emb is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            emb = text_model.embed_tokens(ids)
        cap.inputs_embeds = emb.detach().clone()
        pos = kwargs.get("position_ids")
        cap.position_ids = None if pos is None else pos.detach().clone()

    handles.append(text_model.register_forward_pre_hook(on_text_model, with_kwargs=True))
    for i, layer in enumerate(text_model.layers):
        kind = layer_types[i] if layer_types else "full_attention"

        def on_layer(_mod, _args, kwargs, kind=kind):
            if kind not in cap.masks:
                cap.masks[kind] = kwargs.get("attention_mask")

        handles.append(layer.register_forward_pre_hook(on_layer, with_kwargs=True))

    def remove():
        for h in handles:
            h.remove()

    return cap, remove


def mask_to_allowed(mask: torch.Tensor | None, n: int) -> torch.Tensor:
    """Additive or boolean 4-D mask -> [n, n] uint8, 1 where attention is allowed."""
    if mask is None:
        raise RuntimeError("decoder layer received no attention mask; use attn_implementation='eager'")
    m = mask[0, 0] if mask.dim() == 4 else mask
    allowed = m if m.dtype == torch.bool else (m == 0)
    assert allowed.shape == (n, n), allowed.shape
    return allowed.to(torch.uint8).contiguous()


def extend_inputs(inputs: dict[str, torch.Tensor], token: int) -> dict[str, torch.Tensor]:
    """Append one generated text token to a batch-1 input dict (ids, masks and per-token type ids)."""
    n = inputs["input_ids"].shape[1]
    out = dict(inputs)
    for k, v in inputs.items():
        if torch.is_tensor(v) and v.dim() == 2 and v.shape == (1, n):
            fill = token if k == "input_ids" else (1 if k == "attention_mask" else 0)
            out[k] = torch.cat([v, torch.full((1, 1), fill, dtype=v.dtype)], dim=1)
    return out


@torch.no_grad()
def greedy(model, inputs: dict[str, torch.Tensor], steps: int = GREEDY_TOKENS, recompute: bool = True):
    """Greedy decoding with the KV cache (`generate`), cross-checked against full recomputation unless
    `recompute` is false.

    Returns (tokens, step_logits [steps, V], margins [steps]) where step i's logits are the ones token i was
    picked from (step 0: last prefill position)."""
    # Pure argmax: no EOS stop (and no min_new_tokens, which would mask EOS and change the picks).
    gen_cfg = copy.deepcopy(model.generation_config)
    gen_cfg.update(do_sample=False, max_new_tokens=steps, eos_token_id=None, return_dict_in_generate=True,
                   output_logits=True, use_cache=True)
    out = model.generate(**inputs, generation_config=gen_cfg)
    n = inputs["input_ids"].shape[1]
    tokens = out.sequences[0, n:].tolist()
    step_logits = torch.stack([lg[0].float() for lg in out.logits])
    assert len(tokens) == steps and step_logits.argmax(-1).tolist() == tokens

    cur = dict(inputs)
    for t in tokens if recompute else []:
        nxt = int(model(**cur, use_cache=False).logits[0, -1].argmax())
        if nxt != t:
            raise RuntimeError(f"cached greedy {tokens} diverges from full recompute at token {t} vs {nxt}")
        cur = extend_inputs(cur, t)
    top2 = step_logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    return tokens, step_logits, margins


@dataclass
class Golden:
    """One variant's goldens: tensors (stored in safetensors) and JSON metadata."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def put(self, name: str, t: torch.Tensor) -> None:
        t = t.detach().cpu().contiguous()
        if t.is_floating_point():
            t = t.float()
        elif t.dtype not in (torch.uint8, torch.bool):
            t = t.long()
        self.tensors[name] = t.to(torch.uint8) if t.dtype == torch.bool else t


@torch.no_grad()
def reference_goldens(
    model,
    text_model,
    inputs: dict[str, torch.Tensor],
    *,
    layer_types: list[str] | None,
    encoder: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    processor_keys: tuple[str, ...] = (),
    position_rows: int | None = None,
    store_masks: bool = True,
    cut_at_tie: bool = False,
    stages_only: bool = False,
) -> Golden:
    """Run one prompt through the reloaded reference model and collect every stage.

    encoder: returns the encoder/projector outputs (stage name -> tensor) for the multimodal inputs.
    processor_keys: processor outputs to store as-is (pixel_values, image_grid_thw, ...), batch dim kept.
    position_rows: keep only the last `position_rows` rows of 3-D position ids (M-RoPE: 3).
    cut_at_tie: instead of refusing a greedy run whose margin falls under MIN_GREEDY_MARGIN, keep its tokens (and
    decode logits and margins) before the first such step, and say so in `greedy_cut` (bf16 logits tie exactly
    often enough that some variants of a bf16-compute fixture have such a step; the prompt logits stay whole).
    stages_only: record the greedy tokens as `generate` picks them, without the recompute cross-check or the margin
    guard: for a random-weight checkpoint at real width, whose near-uniform logits tie, the stages are the golden
    and the tokens are not."""
    g = Golden()
    ids = inputs["input_ids"]
    n = ids.shape[1]
    g.put("input_ids", ids[0])
    for k in processor_keys:
        if k in inputs:
            g.put(k, inputs[k])
    if encoder is not None:
        for k, v in encoder(inputs).items():
            g.put(k, v)

    cap, remove = capture_decoder_inputs(text_model, layer_types)
    try:
        logits = model(**inputs, use_cache=False).logits[0].float()
    finally:
        remove()
    g.put("inputs_embeds", cap.inputs_embeds[0])
    pos = cap.position_ids
    if pos is None:
        pos = torch.arange(n)
    elif pos.dim() == 3:
        pos = pos[:, 0]
        if position_rows is not None:
            pos = pos[-position_rows:]
    else:
        pos = pos[0]
    g.put("position_ids", pos)
    if store_masks:
        for kind, m in sorted(cap.masks.items()):
            g.put(f"attention_mask.{kind}", mask_to_allowed(m, n))
    g.put("logits", logits)

    tokens, step_logits, margins = greedy(model, inputs, recompute=not stages_only)
    if float(margins.min()) < MIN_GREEDY_MARGIN and not stages_only:
        if not cut_at_tie:
            raise RuntimeError(f"greedy margin {float(margins.min()):.2e} < {MIN_GREEDY_MARGIN}: pick another prompt")
        cut = int((margins < MIN_GREEDY_MARGIN).nonzero()[0, 0])
        g.meta["greedy_cut"] = (f"step {cut}'s two best logits are {float(margins[cut]):.2e} apart, under "
                                f"{MIN_GREEDY_MARGIN}: the golden keeps the {cut} tokens before it")
        tokens, step_logits, margins = tokens[:cut], step_logits[:cut], margins[:cut]
    g.put("greedy_tokens", torch.tensor(tokens))
    g.put("decode_logits", step_logits)
    g.put("greedy_margins", margins)
    g.meta.update(
        n_prompt_tokens=n,
        input_ids=ids[0].tolist(),
        greedy_tokens=tokens,
        min_greedy_margin=float(margins.min()),
        prefill_chunks=-(-n // PREFILL_CHUNK),
    )
    return g


# ----------------------------------------------------------------------------------------------------------
# writing fixtures


def json_bytes(obj: dict[str, Any]) -> bytes:
    """Sorted keys, one top-level key per line, values compact: diffable and byte-stable."""
    lines = [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(obj.items())]
    return ("{\n" + ",\n".join(lines) + "\n}\n").encode()


def golden_bytes(g: Golden, variant: str) -> tuple[bytes, bytes]:
    meta = dict(g.meta)
    meta["variant"] = variant
    meta["golden_format"] = GOLDEN_FORMAT
    meta["stages"] = {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
                      for k, v in sorted(g.tensors.items())}
    # A single metadata key: safetensors writes the metadata map in hash order, so two keys would make the
    # bytes differ between runs.
    st = st_save(dict(sorted(g.tensors.items())), metadata={"golden_format": str(GOLDEN_FORMAT)})
    js = json_bytes(meta)
    return st, js


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# --check: the comparisons of each fixture being checked, by fixture name (see check.py).
_CHECKS: dict[str, fixture_check.FixtureCheck] = {}
_MADE_ON: dict[str, dict[str, str] | None] = {}


def checker(path: Path) -> fixture_check.FixtureCheck:
    return _CHECKS[path.relative_to(FIXTURES).parts[0]]


def emit(path: Path, data: bytes, check: bool) -> None:
    """Write `data` to `path`, or with `check` compare it with the committed file (check.py's rules)."""
    if check:
        if path.suffix == ".safetensors":
            checker(path).safetensors(path, data)
        else:
            checker(path).exact(path, data)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_golden(fixture: Path, variant: str, g: Golden, check: bool) -> None:
    st, js = golden_bytes(g, variant)
    st_path, js_path = fixture / "goldens" / f"{variant}.safetensors", fixture / "goldens" / f"{variant}.json"
    if check:
        checker(fixture).safetensors(st_path, st, g.meta)
        checker(fixture).golden_json(js_path, js, st)
    else:
        emit(st_path, st, check)
        emit(js_path, js, check)
    m = g.meta
    print(
        f"  {fixture.name}/{variant}: {m['n_prompt_tokens']} prompt tokens, greedy {m['greedy_tokens']}, "
        f"min margin {m['min_greedy_margin']:.4f}",
        flush=True,
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_provenance(fixture: Path, script: str, reference: str, variants: dict[str, str], check: bool,
                     extra_versions: tuple[str, ...] = (), notes: list[str] | None = None,
                     dtype: str = "float32") -> None:
    prov = {
        "cpu": fixture_check.cpu(),
        "reference": reference,
        "versions": versions(*extra_versions),
        "seed": SEED,
        "weights": "every float parameter redrawn: matrices N(0, 1/fan_in), vectors default + N(0, 0.1)",
        "dtype": dtype,
        "prefill_chunk": PREFILL_CHUNK,
        "greedy_tokens": GREEDY_TOKENS,
        "generator": f"tools/oracle/{script}",
        "command": "tools/oracle/regen.sh  (or: $ORACLE_VENV/bin/python tools/oracle/" + script + ")",
        "variants": variants,
        "notes": notes or [],
        "checkpoint_sha256": {
            p.name: sha256(p) for p in sorted(fixture.iterdir()) if p.is_file() and p.name != "provenance.json"
        },
    }
    if check:
        _MADE_ON[fixture.name] = checker(fixture).provenance(fixture / "provenance.json", json_bytes(prov))
    else:
        emit(fixture / "provenance.json", json_bytes(prov), check)


def fixture_size(fixture: Path) -> int:
    return sum(p.stat().st_size for p in fixture.rglob("*") if p.is_file())


def finish(fixture: Path, limit: int = 3_200_000) -> None:
    size = fixture_size(fixture)
    print(f"  {fixture.name}: {size / 1e6:.2f} MB", flush=True)
    if size > limit:
        raise RuntimeError(f"{fixture.name} is {size} bytes, over the {limit}-byte fixture budget")
    if fixture.name in _CHECKS:
        _CHECKS.pop(fixture.name).finish(_MADE_ON.pop(fixture.name, None))


def stage_dir(fixture: Path, check: bool, dtype: torch.dtype = torch.float32) -> Path:
    """Where to save a freshly built checkpoint: the fixture itself, or a scratch dir in --check mode.

    dtype: what the reference computes in, which sets the check's float bounds (check.py)."""
    if not check:
        fresh_dir(fixture)
        return fixture
    _CHECKS[fixture.name] = fixture_check.FixtureCheck(fixture, bf16=dtype == torch.bfloat16)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"mlxcel-oracle-check-{fixture.name}"
    return fresh_dir(scratch)


def compare_checkpoint(built: Path, fixture: Path) -> None:
    """--check: the checkpoint rebuilt from the script against the committed one (check.py's rules)."""
    for p in sorted(built.rglob("*")):
        if p.is_file():
            rel = p.relative_to(built)
            emit(fixture / rel, p.read_bytes(), check=True)
    shutil.rmtree(built)


# ----------------------------------------------------------------------------------------------------------
# text decoders


def text_decoder_fixture(name: str, script: str, model_cls, config, tokenizer, check: bool,
                         notes: list[str] | None = None, dtype: torch.dtype = torch.float32,
                         run_dtype: torch.dtype | None = None, model=None) -> None:
    """Build, save, reload and record a text-only decoder fixture with a short and a long (multi-chunk) prompt.

    dtype: the checkpoint's dtype (the weights are drawn in f32 and rounded once); run_dtype: the reference
    run's (default: the checkpoint's; f32 on a bf16 checkpoint widens the stored weights exactly). model: the
    weights to use instead of a fresh draw of `model_cls(config)` (another fixture's, for a form of it)."""
    run_dtype = run_dtype or dtype
    from transformers import AutoModelForCausalLM, AutoTokenizer

    setup_torch()
    fixture = FIXTURES / name
    print(f"{name}:", flush=True)
    model = (randomize(model_cls(config)) if model is None else model).to(dtype)
    out = stage_dir(fixture, check, run_dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if check:
        compare_checkpoint(out, fixture)

    model = AutoModelForCausalLM.from_pretrained(fixture, attn_implementation="eager", dtype=run_dtype).eval()
    tok = AutoTokenizer.from_pretrained(fixture)
    layer_types = getattr(model.config, "layer_types", None)
    variants = {
        "short": "one user turn, shorter than one prefill chunk",
        "long": f"one user turn, longer than one prefill chunk of {PREFILL_CHUNK} tokens",
    }
    for variant, text in (("short", TEXT_PROMPT), ("long", LONG_PROMPT)):
        messages = [{"role": "user", "content": text}]
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        g = reference_goldens(model, model.model, inputs, layer_types=layer_types)
        g.meta.update(messages=messages, prompt=prompt, add_special_tokens=False)
        if variant == "long":
            assert g.meta["n_prompt_tokens"] > PREFILL_CHUNK
        write_golden(fixture, variant, g, check)
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}[run_dtype]
    stored = "" if run_dtype == dtype else f" on {str(dtype).removeprefix('torch.')} weights"
    write_provenance(fixture, script,
                     f"transformers AutoModelForCausalLM, CPU torch, {precision}{stored}, eager attention",
                     variants, check, notes=notes, dtype=str(run_dtype).removeprefix("torch."))
    finish(fixture)


# ----------------------------------------------------------------------------------------------------------
# vision-language models


@dataclass
class Variant:
    """One prompt of a multimodal fixture: a single user turn mixing text and media items by name."""

    name: str
    description: str
    content: list[str | tuple[str, str]]  # text pieces and (kind, media name), kind "image" or "audio"

    def messages(self) -> list[dict[str, Any]]:
        parts = [{"type": c[0]} if isinstance(c, tuple) else {"type": "text", "text": c} for c in self.content]
        return [{"role": "user", "content": parts}]

    def media(self, kind: str) -> list[str]:
        return [c[1] for c in self.content if isinstance(c, tuple) and c[0] == kind]


def standard_variants(square: str, other: str) -> list[Variant]:
    """The four contract-stressing prompts every VLM fixture carries."""
    return [
        Variant("image", f"one non-square image ({other})", [("image", other), SHORT_PROMPT]),
        Variant("two_images", f"two images of different sizes ({other}, {square})",
                [("image", other), ("image", square), TWO_IMAGE_PROMPT]),
        Variant("text_only", "a text-only prompt to the VLM checkpoint", [TEXT_PROMPT]),
        Variant("long", f"text, an image, more text: longer than one prefill chunk of {PREFILL_CHUNK} tokens",
                [LONG_HEAD, ("image", other), LONG_TAIL]),
    ]


def load_processor(fixture: Path):
    """The reloaded processor with the PIL image backend (portable arithmetic), or torchvision if that is
    the family's only backend. Returns (processor, backend)."""
    from transformers import AutoImageProcessor, AutoProcessor

    processor = AutoProcessor.from_pretrained(fixture)
    if not hasattr(processor, "image_processor"):
        return processor, "none"
    try:
        # The video processors have no PIL backend, so swap only the image processor.
        processor.image_processor = AutoImageProcessor.from_pretrained(fixture, backend="pil")
    except (ValueError, ImportError, KeyError):
        pass
    # A class without a PIL variant (Molmo2) comes back as the torchvision one even when asked for "pil".
    is_pil = type(processor.image_processor).__name__.endswith("Pil")
    return processor, "pil" if is_pil else "torchvision"


@torch.no_grad()
def vlm_fixture(
    name: str,
    script: str,
    model,
    processor,
    media: dict[str, Image.Image | EncodedImage | np.ndarray],
    variants: list[Variant],
    *,
    check: bool,
    encoder: Callable[[Any, dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None,
    position_rows: int | None = None,
    prepare: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    extra: Callable[[Any, dict[str, torch.Tensor], Golden], None] | None = None,
    post_save: Callable[[Path], None] | None = None,
    notes: list[str] | None = None,
    run_dtype: torch.dtype = torch.float32,
    cut_at_tie: bool = False,
) -> None:
    """Build, save, reload and record a multimodal fixture.

    media: images (PIL, saved as PNG; or EncodedImage files, saved as they are) and audio clips (int16 arrays,
    saved as 16 kHz WAV) by name; every image is read back from its file with transformers' `load_image`.
    encoder(model, inputs): the encoder/projector stages for inputs that carry media.
    prepare(inputs): adjust the processor's output before the model sees it (kept in the goldens as given).
    extra(model, inputs, golden): add family-specific tensors or metadata after the reference run.
    post_save(dir): fix a known save bug in the written checkpoint (documented in provenance notes).
    run_dtype: the reference run's; the checkpoint keeps the model's own dtype (f32 on bf16 weights widens the
    stored weights exactly: bf16 storage, f32 compute).
    cut_at_tie: see reference_goldens."""
    from transformers import AutoModelForImageTextToText

    fixture = FIXTURES / name
    print(f"{name}:", flush=True)
    out = stage_dir(fixture, check, run_dtype)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    files = {
        k: save_encoded(m, out, k) if isinstance(m, EncodedImage)
        else save_image(m, out, k) if isinstance(m, Image.Image) else save_audio(m, out, k)
        for k, m in sorted(media.items())
    }
    if post_save is not None:
        post_save(out)
    if check:
        compare_checkpoint(out, fixture)

    stored = str(model.dtype).removeprefix("torch.")
    model = AutoModelForImageTextToText.from_pretrained(fixture, attn_implementation="eager", dtype=run_dtype).eval()
    processor, backend = load_processor(fixture)
    text_model = model.model.language_model
    text_cfg = model.config.get_text_config()
    layer_types = getattr(text_cfg, "layer_types", None)

    for v in variants:
        messages = v.messages()
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        imgs = [load_image(fixture, files[i]) for i in v.media("image")]
        clips = [load_audio(fixture, files[a]) for a in v.media("audio")]
        kwargs = {"images": imgs} if imgs else {}
        if clips:
            kwargs["audio"] = clips
        inputs = dict(processor(text=[prompt], return_tensors="pt", **kwargs))
        proc_keys = tuple(k for k in sorted(inputs) if k not in ("input_ids", "attention_mask"))
        run_inputs = prepare(inputs) if prepare else inputs
        g = reference_goldens(
            model, text_model, run_inputs, layer_types=layer_types,
            encoder=(lambda x: encoder(model, x)) if (encoder and (imgs or clips)) else None,
            processor_keys=proc_keys, position_rows=position_rows, cut_at_tie=cut_at_tie,
        )
        for k in proc_keys:  # what the processor produced, before any `prepare`
            g.put(k, inputs[k][0] if k.endswith("type_ids") else inputs[k])
        g.meta.update(messages=messages, prompt=prompt, processor_outputs=list(proc_keys))
        if imgs:
            g.meta.update(images=[files[i] for i in v.media("image")], image_backend=backend,
                          image_sizes=[list(im.size) for im in imgs])
        if clips:
            g.meta.update(audio=[files[a] for a in v.media("audio")], audio_rate=AUDIO_RATE,
                          audio_samples=[len(c) for c in clips])
        if imgs and backend == "pil" and "pixel_values" in inputs:
            # How far the default (torchvision) backend is from the PIL one these goldens use.
            from transformers import AutoProcessor

            tv = AutoProcessor.from_pretrained(fixture)(text=[prompt], images=imgs, return_tensors="pt")
            g.meta["pixel_values_torchvision_max_abs_diff"] = float(
                (tv["pixel_values"].float() - inputs["pixel_values"].float()).abs().max()
            )
        if extra is not None:
            extra(model, run_inputs, g)
        write_golden(fixture, v.name, g, check)
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}[run_dtype]
    on = "" if stored == str(run_dtype).removeprefix("torch.") else f" on {stored} weights"
    write_provenance(
        fixture, script,
        f"transformers {type(model).__name__}, CPU torch, {precision}{on}, eager attention; processor backend {backend}",
        {v.name: v.description for v in variants}, check, notes=notes, dtype=str(run_dtype).removeprefix("torch."),
    )
    finish(fixture)


# ----------------------------------------------------------------------------------------------------------
# mlx-vlm references (families transformers does not have)


def randomize_mlx(model, seed: int = SEED + 1, vec_std: float = 0.1) -> None:
    """`randomize` for an mlx module: matrices N(0, 1/fan_in), vectors default + N(0, vec_std), drawn with
    numpy in sorted-name order so the weights do not depend on mlx's generator."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    rng = np.random.default_rng(seed)
    new = []
    for name, p in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        if p.ndim >= 2:
            fan_in = int(np.prod(p.shape[1:]))
            v = rng.standard_normal(p.shape, dtype=np.float32) / np.float32(fan_in**0.5)
        else:
            v = np.array(p, dtype=np.float32) + rng.standard_normal(p.shape, dtype=np.float32) * np.float32(vec_std)
        new.append((name, mx.array(v)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def mlx_reference_goldens(model, ids, embed: Callable, pixels, gen_kwargs: dict[str, Any]) -> Golden:
    """Decoder stages of an mlx-vlm model for one prompt: inputs_embeds, positions, full logits, and greedy
    decoding through the KV cache (prefill once, then a token at a time), cross-checked against mlx-vlm's
    `generate_step` and against full recomputation. embed(ids) returns the merged input embeddings."""
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models.cache import make_prompt_cache

    lm = model.language_model
    g = Golden()
    n = ids.shape[1]
    emb = embed(ids)
    g.put("input_ids", torch.from_numpy(np.array(ids[0])))
    g.put("inputs_embeds", torch.from_numpy(np.array(emb[0])))
    g.put("position_ids", torch.arange(n))
    g.put("logits", torch.from_numpy(np.array(lm(ids, inputs_embeds=emb).logits[0])))

    cache = make_prompt_cache(lm)
    step = lm(ids, inputs_embeds=emb, cache=cache).logits[0, -1]
    tokens, steps = [], []
    for _ in range(GREEDY_TOKENS):
        mx.eval(step)
        steps.append(np.array(step))
        tokens.append(int(np.argmax(steps[-1])))
        step = lm(mx.array([[tokens[-1]]]), cache=cache).logits[0, -1]

    gen = generate_step(ids, model, pixels, None, temperature=0.0, max_tokens=GREEDY_TOKENS, **gen_kwargs)
    ref = [int(tok) for (tok, _), _ in zip(gen, range(GREEDY_TOKENS))]
    if ref != tokens:
        raise RuntimeError(f"cached greedy {tokens} != mlx-vlm generate_step {ref}")
    cur = ids
    for tok in tokens:
        nxt = int(np.argmax(np.array(lm(cur, inputs_embeds=embed(cur)).logits[0, -1])))
        if nxt != tok:
            raise RuntimeError(f"cached greedy {tokens} diverges from full recompute at {tok} vs {nxt}")
        cur = mx.concatenate([cur, mx.array([[tok]], dtype=cur.dtype)], axis=1)

    step_logits = torch.from_numpy(np.stack(steps))
    top2 = step_logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    if float(margins.min()) < MIN_GREEDY_MARGIN:
        raise RuntimeError(f"greedy margin {float(margins.min()):.2e} < {MIN_GREEDY_MARGIN}: pick another prompt")
    g.put("greedy_tokens", torch.tensor(tokens))
    g.put("decode_logits", step_logits)
    g.put("greedy_margins", margins)
    g.meta.update(n_prompt_tokens=n, input_ids=np.array(ids[0]).tolist(), greedy_tokens=tokens,
                  min_greedy_margin=float(margins.min()), prefill_chunks=-(-n // PREFILL_CHUNK))
    return g


def mlx_prompt_mask(g: Golden, n: int) -> None:
    """Records the mask an mlx-vlm language model builds for an n-row prompt (mask=None:
    create_attention_mask over the embeddings, without a cache), as an array."""
    import mlx.core as mx
    from mlx_vlm.models.base import create_attention_mask

    m = np.array(create_attention_mask(mx.zeros((1, n, 1)), None, return_array=True))
    allowed = torch.from_numpy(m if m.dtype == np.bool_ else (m == 0))
    g.put("attention_mask.full_attention", mask_to_allowed(allowed, n))


def mlx_fixture(name: str, script: str, build: Callable[[Path], None], load_processor: Callable[[Path], Any],
                run_variant: Callable[[Any, Any, Path, Variant], Golden], variants: list[Variant], *,
                check: bool, reference: str, notes: list[str]) -> None:
    """Build, save, reload (with mlx-vlm's load_model) and record a fixture whose reference is mlx-vlm.

    build(dir) writes the checkpoint; run_variant(model, processor, fixture, variant) returns its goldens."""
    from mlx_vlm.utils import load_model

    setup_torch()
    fixture = FIXTURES / name
    print(f"{name}:", flush=True)
    out = stage_dir(fixture, check)
    build(out)
    if check:
        compare_checkpoint(out, fixture)
    model = load_model(fixture)
    processor = load_processor(fixture)
    for v in variants:
        write_golden(fixture, v.name, run_variant(model, processor, fixture, v), check)
    write_provenance(fixture, script, reference, {v.name: v.description for v in variants}, check,
                     extra_versions=("mlx", "mlx-cpu", "mlx-vlm"), notes=notes)
    finish(fixture)
