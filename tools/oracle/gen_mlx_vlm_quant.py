"""MLX affine-quantized forms of the vision-language fixtures, made by mlx-vlm's own converter, with mlx-vlm as the
reference: tests/fixtures/qwen2_vl_mlx_q4, gemma3_mlx_q4 and llava_mlx_q4.

Each checkpoint is what `mlx_vlm.convert(base, mlx_path=..., quantize=True, q_group_size=64, q_bits=4,
dtype="float32")` writes, as a user gets it from the MLX community: config.json with its `quantization` block (and
the `quantization_config` copy), model.safetensors (mlx-vlm's own key names: `language_model.*`, `vision_tower.*`,
`multi_modal_projector.*`; each quantized Linear and Embedding as a U32 `weight` of packed codes beside f32 `scales`
and `biases`), model.safetensors.index.json, the processor and tokenizer files mlx-vlm saves (tokenizer.json,
tokenizer_config.json, chat_template.jinja and chat_template.json, preprocessor_config.json, processor_config.json,
generation_config.json) and the model card README.md (front matter only, no paths). Group 64, the largest of 64/32
dividing every quantized layer's input size (64 and 128 in all three decoders). mlx-vlm's default predicate
(`skip_multimodal_module`) leaves the vision tower and the projector dense; the decoder's Linears, the token
embedding and the LM head are quantized (for tied Gemma 3 an lm_head copy of the embedding is quantized and stored).

**The base is the fixture's Hub form** (tests/fixtures/<name>_hub: the same weights byte for byte, transformers 4's
config layout, which is what MLX community checkpoints are converted from). mlx-vlm 0.7.10 cannot load the
transformers 5 configs of tests/fixtures/qwen2_vl, gemma3 and llava (see `UNREADABLE`), and two Hub configs need one
documented edit each before mlx-vlm can build the model (see `CONFIG_EDITS`).

The goldens come from mlx-vlm loading the written fixture on mlx-cpu in float32, for the four standard variants:
the prompt through mlx-vlm's processor (`prepare_inputs`; llava: transformers' LlavaProcessor with the PIL backend,
because mlx-vlm's own fails under transformers 5.24), input_ids and the preprocessed tensors, vision_hidden,
image_features (the projector output that is merged), inputs_embeds as the first decoder layer receives them,
position_ids (qwen2_vl: M-RoPE [3, N] and rope_delta), full-prompt logits, and 16 greedy tokens decoded through
mlx-vlm's KV cache with each step's logits. mlx-vlm's `stream_generate` (temperature 0, EOS not stopping) is the
acceptance reference: it must pick the same 16 tokens, as must full recomputation.

Each run also runs mlx-vlm on the unquantized base and compares it stage by stage with the base fixture's
transformers goldens (recorded per variant in the goldens' JSON as `unquantized_base_vs_transformers`, summarised
with the first divergent stage in the provenance notes), and checks, by key after undoing mlx-vlm's renames and
layouts, that every dequantized weight is within one quantization step of the base fixture's weight and that every
dense tensor equals the base's exactly."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import common
import gen_mlx_quant
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import torch
from safetensors.numpy import load_file

MODE = "affine"
BITS = 4
GROUP = 64
VARIANTS = common.standard_variants("tall", "wide")
STAGE_ORDER = ["input_ids", "pixel_values", "vision_hidden", "image_features", "inputs_embeds", "position_ids",
               "logits", "greedy_tokens", "decode_logits"]
# A float stage agrees when within this of the transformers golden (the f32 parity gate of logits).
AGREE_ATOL = 1e-4

# What mlx-vlm 0.7.10 says when given the transformers 5 config of the fixture itself.
UNREADABLE = {
    "qwen2_vl": "ModelConfig.from_dict copies the top-level keys into text_config and ignores transformers 5's nested "
                "text_config: TextConfig() missing hidden_size, num_hidden_layers, ...",
    "gemma3": "reads mm_tokens_per_image from text_config only (default 256): AvgPool2d kernel_size 0",
    "llava": "transformers 5 writes the CLIP tower as vision_tower.* with a flat vision_config that mlx-vlm's "
             "sanitize does not map: 55 parameters not in model",
}


def edit_qwen2_vl(cfg: dict) -> str:
    cfg["vision_config"].pop("model_type")
    return ("vision_config.model_type 'qwen2_vl_vision' (what transformers 5 writes) removed, as the Hub's Qwen2-VL "
            "configs have none: mlx-vlm's qwen2_vl VisionModel refuses any model_type but its default 'qwen2_vl'")


def edit_gemma3(cfg: dict) -> str:
    cfg["text_config"]["mm_tokens_per_image"] = cfg["mm_tokens_per_image"]
    return (f"text_config.mm_tokens_per_image = {cfg['mm_tokens_per_image']} added (a copy of the top-level key, "
            "which transformers reads): mlx-vlm's Gemma3 projector reads it from text_config only, defaulting to "
            "256, which real Gemma 3 checkpoints happen to use; transformers ignores the added key")


def edit_none(cfg: dict) -> str:
    return ""


def identity_layout(key: str, v: np.ndarray) -> np.ndarray:
    return v


# name -> (base fixture, its Hub form converted, config edit, [(mlx prefix, base prefix)], layout undo by key)
def conv_oihw(key: str, v: np.ndarray) -> np.ndarray:
    # mlx Conv2d kernels are channels-last [out, kh, kw, in]; torch's are [out, in, kh, kw]
    return v.transpose(0, 3, 1, 2) if key.endswith("patch_embedding.weight") else v


def conv3d_oithw(key: str, v: np.ndarray) -> np.ndarray:
    # mlx Conv3d kernels are channels-last [out, t, kh, kw, in]; torch's are [out, in, t, kh, kw]
    return v.transpose(0, 4, 1, 2, 3) if key.endswith("patch_embed.proj.weight") else v


FAMILIES = {
    "qwen2_vl": dict(
        edit=edit_qwen2_vl, prefixes=[("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                                      ("vision_tower.", "visual.")],
        layout=conv3d_oithw, tied=False,
        layout_note="vision_tower.patch_embed.proj.weight is stored [out, t, kh, kw, in] = base [out, in, t, kh, kw] "
                    "transposed (0, 2, 3, 4, 1); undo with transpose (0, 4, 1, 2, 3)",
    ),
    "gemma3": dict(
        edit=edit_gemma3, prefixes=[("language_model.lm_head.", "language_model.model.embed_tokens."),
                                    ("vision_tower.vision_model.", "vision_tower."), ("", "")],
        layout=conv_oihw, tied=True,
        layout_note="vision_tower.vision_model.embeddings.patch_embedding.weight is stored [out, kh, kw, in] (OHWI) "
                    "= base [out, in, kh, kw] transposed (0, 2, 3, 1); undo with transpose (0, 3, 1, 2)",
    ),
    "llava": dict(
        edit=edit_none, prefixes=[("vision_tower.vision_model.", "vision_tower."), ("", "")],
        layout=conv_oihw, tied=False,
        layout_note="vision_tower.vision_model.embeddings.patch_embedding.weight is stored [out, kh, kw, in] (OHWI) "
                    "= base [out, in, kh, kw] transposed (0, 2, 3, 1); undo with transpose (0, 3, 1, 2)",
    ),
}


def base_key(fam: str, key: str) -> str:
    for ours, theirs in FAMILIES[fam]["prefixes"]:
        if key.startswith(ours):
            return theirs + key[len(ours):]
    return key


def mapping_note(fam: str) -> str:
    rows = [f"{ours or '(rest)'}* -> {theirs or '(same)'}*" for ours, theirs in FAMILIES[fam]["prefixes"]]
    text = "key mapping mlx-vlm -> tests/fixtures/" + fam + " (first match): " + "; ".join(rows)
    if FAMILIES[fam]["tied"]:
        text += ("; the tied head: language_model.lm_head.{weight,scales,biases} is the quantized copy of the "
                 "embedding mlx-vlm's sanitize adds (codes, scales and biases identical to embed_tokens'), the base "
                 "has no lm_head tensor")
    return text


# ----------------------------------------------------------------------------------------------------------
# conversion


def stage_base(fam: str, tmp: Path) -> tuple[Path, str]:
    """The Hub form's checkpoint files (no goldens, inputs or provenance, which mlx_vlm.convert would copy) with the
    family's config edit. Returns (dir, edit note)."""
    src = common.FIXTURES / f"{fam}_hub"
    dst = tmp / f"{fam}_base"
    dst.mkdir()
    for p in sorted(src.iterdir()):
        if p.is_file() and p.name != "provenance.json":
            shutil.copyfile(p, dst / p.name)
    cfg = json.loads((dst / "config.json").read_text())
    note = FAMILIES[fam]["edit"](cfg)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst, note


def convert(base: Path, out: Path) -> None:
    from mlx_vlm import convert as mlx_convert

    out.rmdir()  # mlx_vlm.convert writes into a fresh directory
    mlx_convert(str(base), mlx_path=str(out), quantize=True, q_group_size=GROUP, q_bits=BITS, dtype="float32")
    leftovers = [p.name for p in out.iterdir() if p.is_dir() or p.name == "provenance.json"]
    assert not leftovers, leftovers
    card = (out / "README.md").read_text()
    assert len(card) < 200 and "/" not in card.replace("image-text-to-text", ""), card


def copy_inputs(fam: str, out: Path) -> None:
    (out / "inputs").mkdir()
    for stem in ("tall", "wide"):
        shutil.copyfile(common.FIXTURES / fam / "inputs" / f"{stem}.png", out / "inputs" / f"{stem}.png")


# ----------------------------------------------------------------------------------------------------------
# mlx-vlm's pipeline, stage by stage


class Identity(nn.Module):
    def __call__(self, x):
        return x


class NullDetokenizer:
    """stream_generate's text side. The tiny tokenizers have fewer ids than the embedding has rows (vocab_size 448),
    and mlx-vlm's streaming detokenizer raises IndexError on a generated id past the tokenizer's table; the text is
    not what is checked, the token ids are."""

    last_segment = ""

    def add_token(self, token, **_kw) -> None:
        pass

    def finalize(self) -> None:
        pass


def load(fixture: Path, fam: str):
    """mlx-vlm's model and the processor the goldens use. Returns (model, processor, backend)."""
    from mlx_vlm import load as mlx_load

    model, processor = mlx_load(str(fixture))
    backend = {"qwen2_vl": f"mlx-vlm {type(processor).__name__} with {type(processor.image_processor).__name__}",
               "gemma3": "pil"}.get(fam)
    if fam == "llava":
        # mlx-vlm 0.7.10's LlavaProcessor passes tokenizer arguments (padding, ...) to transformers 5.24's image
        # processor, which refuses them; transformers' own processor (PIL backend) stands in.
        tok = processor.tokenizer
        processor, backend = common.load_processor(fixture)
        processor.tokenizer.stopping_criteria = tok.stopping_criteria
    return model, processor, backend


def prepare(fam: str, model, processor, fixture: Path, prompt: str, images: list[str]) -> dict:
    from mlx_vlm.utils import prepare_inputs

    paths = [str(fixture / i) for i in images]
    if fam == "llava":
        imgs = [common.load_image(fixture, i) for i in images]
        kw = {"images": imgs} if imgs else {}
        raw = processor(text=[prompt], return_tensors="np", **kw)
        return {k: mx.array(v) for k, v in raw.items()}
    inputs = prepare_inputs(processor, images=paths or None, prompts=prompt,
                            image_token_index=getattr(model.config, "image_token_index", None),
                            add_special_tokens=False)
    return dict(inputs)


def reset(lm) -> None:
    """qwen2_vl's language model keeps the last prompt's M-RoPE state between calls."""
    for attr in ("_rope_deltas", "_position_ids"):
        if hasattr(lm, attr):
            setattr(lm, attr, None)


def embed(fam: str, model, ids, inputs: dict):
    """mlx-vlm's get_input_embeddings for `ids` with the prompt's media. Returns (embeds, decoder kwargs)."""
    pixels = inputs.get("pixel_values")
    kw = {"mask": mx.ones(ids.shape, dtype=mx.int32)}
    if "image_grid_thw" in inputs:
        kw["image_grid_thw"] = inputs["image_grid_thw"]
    out = model.get_input_embeddings(ids, pixels, **kw)
    extra = {k: v for k, v in out.to_dict().items() if k in ("position_ids", "rope_deltas") and v is not None}
    return out.inputs_embeds, extra


def encoder_stages(fam: str, model, inputs: dict) -> dict[str, np.ndarray]:
    pixels = inputs["pixel_values"]
    if fam == "qwen2_vl":
        grid = inputs["image_grid_thw"]
        merger = model.vision_tower.merger
        model.vision_tower.merger = Identity()
        try:
            hidden = model.vision_tower(pixels, grid)
        finally:
            model.vision_tower.merger = merger
        return {"vision_hidden": np.array(hidden), "image_features": np.array(model.vision_tower(pixels, grid))}
    if fam == "gemma3":
        hidden, _, _ = model.vision_tower(pixels.transpose(0, 2, 3, 1), output_hidden_states=True)
        feats = model.multi_modal_projector(hidden)
        return {"vision_hidden": np.array(hidden), "image_features": np.array(feats).reshape(-1, feats.shape[-1])}
    *_, states = model.vision_tower(pixels.transpose(0, 2, 3, 1), output_hidden_states=True)
    selected = states[model.vision_feature_layer][:, 1:]
    feats = model.multi_modal_projector(selected)
    return {"vision_hidden": np.array(selected), "image_features": np.array(feats).reshape(-1, feats.shape[-1])}


def fresh(emb):
    """A new array with emb's values: mlx-vlm's Gemma3Model scales its inputs_embeds in place (h *= ...), which
    would rescale the caller's array on every call."""
    return emb * 1


def decoder_input(fam: str, model, emb):
    """What the first decoder layer receives: Gemma 3 scales the whole sequence by sqrt(hidden) rounded to bf16
    inside its text model (mlx-vlm divides the image rows by sqrt(hidden) first, so they arrive unscaled)."""
    if fam == "gemma3":
        hidden = model.language_model.config.hidden_size
        return emb * mx.array(hidden**0.5, mx.bfloat16).astype(emb.dtype)
    return emb


def checkpoint_template(fixture: Path) -> str:
    """The chat template a checkpoint carries: chat_template.jinja, or the Hub form's chat_template.json."""
    if (fixture / "chat_template.jinja").is_file():
        return (fixture / "chat_template.jinja").read_text()
    return json.loads((fixture / "chat_template.json").read_text())["chat_template"]


def run_variant(fam: str, model, processor, fixture: Path, v: common.Variant, backend: str) -> common.Golden:
    from mlx_vlm import stream_generate
    from mlx_vlm.models.cache import make_prompt_cache

    lm = model.language_model
    messages = v.messages()
    if getattr(processor, "chat_template", None):
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:  # mlx-vlm's Gemma3Processor does not pick up chat_template.jinja; the template is the checkpoint's
        prompt = processor.tokenizer.apply_chat_template(
            messages, chat_template=checkpoint_template(fixture), add_generation_prompt=True,
            tokenize=False)
    base = json.loads((common.FIXTURES / fam / "goldens" / f"{v.name}.json").read_text())
    if prompt != base["prompt"]:
        raise RuntimeError(f"prompt {prompt!r} differs from tests/fixtures/{fam}'s {base['prompt']!r}")
    images = [f"inputs/{i}.png" for i in v.media("image")]
    inputs = prepare(fam, model, processor, fixture, prompt, images)
    ids = inputs["input_ids"].astype(mx.int32)
    n = ids.shape[1]
    if np.array(ids[0]).tolist() != base["input_ids"]:
        raise RuntimeError(f"prompt ids differ from tests/fixtures/{fam}'s")

    g = common.Golden()
    g.put("input_ids", torch.from_numpy(np.array(ids[0]).astype(np.int64)))
    # The masks mlx-vlm's language model applies over the prompt, as boolean matrices (its
    # create_attention_mask: causal; Gemma 3's sliding layers also windowed). mlx-vlm has no
    # bidirectional image blocks.
    from mlx_vlm.models.base import create_attention_mask

    rows = mx.zeros((1, n, 1))
    masks = {"full_attention": create_attention_mask(rows, None, return_array=True)}
    if fam == "gemma3":
        window = lm.config.sliding_window
        masks["sliding_attention"] = create_attention_mask(rows, None, window_size=window, return_array=True)
    for kind, mask in masks.items():
        g.put(f"attention_mask.{kind}", torch.from_numpy(np.array(mask).astype(np.uint8)))
    proc_keys = sorted(k for k in inputs if k not in ("input_ids", "attention_mask"))
    for k in proc_keys:
        g.put(k, torch.from_numpy(np.array(inputs[k])))
    if images:
        for k, t in encoder_stages(fam, model, inputs).items():
            g.put(k, torch.from_numpy(t))

    reset(lm)
    emb, extra = embed(fam, model, ids, inputs)
    g.put("inputs_embeds", torch.from_numpy(np.array(decoder_input(fam, model, emb)[0])))
    if "position_ids" in extra:
        pos = np.array(extra["position_ids"]).astype(np.int64)  # [3, 1, N] with media, [1, N] for text only
        g.put("position_ids", torch.from_numpy(pos[:, 0] if pos.ndim == 3 else pos[0]))
        g.meta["rope_delta"] = int(np.array(extra["rope_deltas"]).reshape(-1)[0])
    else:
        g.put("position_ids", torch.arange(n))
    reset(lm)
    g.put("logits", torch.from_numpy(np.array(lm(ids, inputs_embeds=fresh(emb), **extra).logits[0])))

    # Greedy decode through mlx-vlm's KV cache, as generate_step drives it: the prompt with its position metadata,
    # then one token at a time (the model continues positions from its cache offset and rope delta).
    reset(lm)
    cache = make_prompt_cache(lm)
    step = lm(ids, inputs_embeds=fresh(emb), cache=cache, **extra).logits[0, -1]
    tokens, steps = [], []
    for _ in range(common.GREEDY_TOKENS):
        mx.eval(step)
        steps.append(np.array(step))
        tokens.append(int(np.argmax(steps[-1])))
        step = lm(mx.array([[tokens[-1]]], dtype=ids.dtype), cache=cache).logits[0, -1]

    # mlx-vlm's own generation, the acceptance reference: greedy (temperature 0), EOS not stopping.
    import importlib

    dispatch = importlib.import_module("mlx_vlm.generate.dispatch")  # mlx_vlm.generate is also a function's name

    tok = processor.tokenizer
    stop, detok = tok.stopping_criteria, dispatch.make_streaming_detokenizer
    tok.stopping_criteria = lambda _token: False
    dispatch.make_streaming_detokenizer = lambda _processor: NullDetokenizer()
    reset(lm)
    try:
        if fam == "llava":  # prepared by transformers' processor (see load)
            kw = dict(input_ids=ids, pixel_values=inputs.get("pixel_values"), mask=inputs["attention_mask"])
            results = list(stream_generate(model, processor, prompt, max_tokens=common.GREEDY_TOKENS,
                                           temperature=0.0, **kw))
        else:
            results = list(stream_generate(model, processor, prompt, image=[str(fixture / i) for i in images] or None,
                                           max_tokens=common.GREEDY_TOKENS, temperature=0.0))
    finally:
        tok.stopping_criteria, dispatch.make_streaming_detokenizer = stop, detok
    ref = results[-1].token_ids
    if ref != tokens:
        raise RuntimeError(f"cached greedy {tokens} != mlx_vlm.stream_generate {ref}")
    cur = ids
    for t in tokens:
        reset(lm)
        e, x = embed(fam, model, cur, inputs)
        reset(lm)
        nxt = int(np.argmax(np.array(lm(cur, inputs_embeds=fresh(e), **x).logits[0, -1])))
        if nxt != t:
            raise RuntimeError(f"cached greedy {tokens} diverges from full recompute at {t} vs {nxt}")
        cur = mx.concatenate([cur, mx.array([[t]], dtype=cur.dtype)], axis=1)
    reset(lm)

    step_logits = torch.from_numpy(np.stack(steps))
    top2 = step_logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    if float(margins.min()) < common.MIN_GREEDY_MARGIN:
        raise RuntimeError(f"greedy margin {float(margins.min()):.2e} < {common.MIN_GREEDY_MARGIN}")
    g.put("greedy_tokens", torch.tensor(tokens))
    g.put("decode_logits", step_logits)
    g.put("greedy_margins", margins)
    g.meta.update(n_prompt_tokens=n, input_ids=np.array(ids[0]).tolist(), greedy_tokens=tokens,
                  min_greedy_margin=float(margins.min()), prefill_chunks=-(-n // common.PREFILL_CHUNK),
                  messages=messages, prompt=prompt, processor_outputs=proc_keys, add_special_tokens=False)
    if images:
        g.meta.update(images=images, image_backend=backend,
                      image_sizes=[list(common.load_image(fixture, i).size) for i in images])
    return g


# ----------------------------------------------------------------------------------------------------------
# the unquantized base against the transformers goldens


def compare_base(fam: str, g: common.Golden) -> tuple[dict, str | None]:
    """mlx-vlm's stages on the unquantized base against tests/fixtures/<fam>'s transformers goldens.

    Returns ({stage: max abs diff, or equal for integer stages}, the first stage beyond AGREE_ATOL or unequal)."""
    ref = load_file(str(common.FIXTURES / fam / "goldens" / f"{g.meta['variant_name']}.safetensors"))
    out, first = {}, None
    for stage in STAGE_ORDER:
        if stage not in g.tensors or stage not in ref:
            continue
        a, b = g.tensors[stage].numpy(), ref[stage]
        if stage == "position_ids" and a.ndim == 2 and b.ndim == 1:
            # transformers records a text-only prompt's positions as [N]; mlx-vlm gives M-RoPE's [3, N] (equal rows)
            a = a[0] if (a == a[:1]).all() else a
        if a.dtype.kind != "f" or stage in ("greedy_tokens",):
            same = a.shape == b.shape and np.array_equal(a, b)
            out[stage] = bool(same)
            bad = not same
        elif a.shape != b.shape:
            out[stage] = f"shape {list(a.shape)} vs {list(b.shape)}"
            bad = True
        else:
            out[stage] = float(np.abs(a.astype(np.float64) - b).max())
            bad = out[stage] > AGREE_ATOL
        if bad and first is None:
            first = stage
    return out, first


CAUSES = {
    ("gemma3", "inputs_embeds"): (
        "mlx-vlm 0.7.10's gemma3 divides the image features by sqrt(config.hidden_size), the top-level ModelConfig "
        "field, which Gemma 3 configs do not carry (default 2048), before its text model multiplies the whole "
        "sequence by sqrt(text hidden_size) rounded to bf16 (8.0); transformers places the image rows unscaled, so "
        "mlx-vlm's image rows are transformers' times 8 / sqrt(2048) = 0.1767767 (text rows agree exactly; a real "
        "Gemma 3 4B would get sqrt(2560) / sqrt(2048) = 1.118)"),
}


def gemma3_mask_probe(model, processor, fixture: Path) -> str:
    """Is the scale the only difference? The image variant again with config.hidden_size set to the text hidden
    size (image rows then arrive unscaled, as in transformers)."""
    ref = load_file(str(common.FIXTURES / "gemma3" / "goldens" / "image.safetensors"))
    meta = json.loads((common.FIXTURES / "gemma3" / "goldens" / "image.json").read_text())
    saved = model.config.hidden_size
    model.config.hidden_size = model.language_model.config.hidden_size
    try:
        inputs = prepare("gemma3", model, processor, fixture, meta["prompt"], meta["images"])
        ids = inputs["input_ids"].astype(mx.int32)
        emb, _ = embed("gemma3", model, ids, inputs)
        e = np.array(decoder_input("gemma3", model, emb)[0])
        logits = np.array(model.language_model(ids, inputs_embeds=fresh(emb)).logits[0])
    finally:
        model.config.hidden_size = saved
    emb_diff = float(np.abs(e - ref["inputs_embeds"]).max())
    rows = np.abs(logits - ref["logits"]).max(-1)
    first_row = int(np.argmax(rows > AGREE_ATOL))
    first_image = int(np.argmax(np.array(ids[0]) == model.config.image_token_index))
    assert emb_diff < AGREE_ATOL and rows.max() > AGREE_ATOL and first_row == first_image, (emb_diff, first_row)
    return ("with config.hidden_size set to 64 (image rows unscaled) the image variant's inputs_embeds agree within "
            f"{AGREE_ATOL:g} but its logits still diverge from row {first_row}, the first image token, on (rows before "
            "agree): the second difference is the attention mask: mlx-vlm's gemma3 decodes with the causal and "
            "sliding-window masks only, transformers attends bidirectionally inside each image block "
            "(token_type_ids), so an image token sees the later tokens of its own block in transformers only")


# ----------------------------------------------------------------------------------------------------------
# weights against the base


def weights_cross_check(fam: str, fixture: Path) -> tuple[list[str], list[str], int]:
    """Every tensor of the quantized fixture against tests/fixtures/<fam> after undoing renames and layouts.

    Returns (notes, quantized module paths, dense tensor count)."""
    spec = FAMILIES[fam]
    quant = json.loads((fixture / "config.json").read_text())["quantization"]
    q = mx.load(str(fixture / "model.safetensors"))
    base = load_file(str(common.FIXTURES / fam / "model.safetensors"))
    covered: set[str] = set()
    quantized, worst, worst_ratio, hand_diff = [], (0.0, "-"), (0.0, "-"), 0.0
    for key in sorted(k for k in q if k.endswith(".scales")):
        path = key.removesuffix(".scales")
        p = gen_mlx_quant.module_params(quant, path)
        w, s, b = q[f"{path}.weight"], q[f"{path}.scales"], q[f"{path}.biases"]
        assert w.dtype == mx.uint32 and s.dtype == mx.float32 and b.dtype == mx.float32, path
        deq = np.array(mx.dequantize(w, s, b, group_size=p["group_size"], bits=p["bits"], mode=MODE))
        bk = base_key(fam, f"{path}.weight")
        ref = base[bk]
        covered.add(bk)
        assert deq.shape == ref.shape and s.shape[-1] * p["group_size"] == ref.shape[-1], path
        scales = np.repeat(np.array(s), p["group_size"], axis=-1)
        biases = np.repeat(np.array(b), p["group_size"], axis=-1)
        err = np.abs(deq - ref)
        ratio = float((err / np.abs(scales)).max())
        if ratio > 1.0 + 1e-5:
            raise RuntimeError(f"{path}: dequantized weight {ratio:.3g} scales from the base's {bk}")
        if err.max() > worst[0]:
            worst = (float(err.max()), path)
        if ratio > worst_ratio[0]:
            worst_ratio = (ratio, path)
        codes = gen_mlx_quant.unpack(np.array(w), p["bits"]).astype(np.float32)
        hand_diff = max(hand_diff, float(np.abs(codes * scales + biases - deq).max()))
        quantized.append(path)
    dense = 0
    for key in sorted(q):
        if key.endswith((".scales", ".biases")) or key.removesuffix(".weight") in quantized:
            continue
        bk = base_key(fam, key)
        v = spec["layout"](key, np.array(q[key]))
        assert q[key].dtype == mx.float32, key
        if bk not in base or v.shape != base[bk].shape or not np.array_equal(v, base[bk]):
            raise RuntimeError(f"dense {key} does not equal the base's {bk} after undoing the layout")
        covered.add(bk)
        dense += 1
    missing = sorted(set(base) - covered)
    if missing:
        raise RuntimeError(f"base tensors with no mlx-vlm counterpart: {missing}")
    if spec["tied"]:
        e, h = "language_model.model.embed_tokens", "language_model.lm_head"
        for part in ("weight", "scales", "biases"):
            assert np.array_equal(np.array(q[f"{e}.{part}"]), np.array(q[f"{h}.{part}"])), part
    notes = [
        f"weights cross-check against tests/fixtures/{fam} by key (every base tensor covered): {len(quantized)} "
        f"quantized modules dequantize (mx.dequantize) within one step of their group's scale of the base weight "
        f"(max {worst_ratio[0]:.4g} scales at {worst_ratio[1]}; max abs {worst[0]:.4g} at {worst[1]}); numpy by hand "
        f"(u32 words unpacked least significant bits first, q * scale + bias in f32) is "
        + ("bit-identical to mx.dequantize" if hand_diff == 0.0 else f"{hand_diff:.3g} from mx.dequantize")
        + f"; {dense} dense tensors equal the base's exactly after undoing the layout conventions",
    ]
    return notes, quantized, dense


def pattern(path: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", path)


def quant_summary(quantized: list[str], quant: dict, bpw: float, dense_prefixes: list[str]) -> str:
    mods = sorted({pattern(p) for p in quantized})
    overrides = {k: v for k, v in quant.items() if k not in ("group_size", "bits", "mode")}
    assert not overrides, overrides
    return (f"quantization: {json.dumps(quant, sort_keys=True)}: affine, {quant['bits']} bits, group "
            f"{quant['group_size']} for every quantized module, no per-module entries; {len(quantized)} quantized "
            f"modules: {', '.join(mods)}; dense (f32, as the base): {', '.join(dense_prefixes)} and every norm; "
            f"weights U32 packed codes (8 a word, least significant bits first), scales and biases f32 "
            f"[out, in / {quant['group_size']}]; {bpw:.3f} bits per weight over the whole model, dense vision "
            f"tower included (mlx_vlm.quant_utils.compute_bits_per_weight)")


def top_prefixes(fixture: Path) -> list[str]:
    keys = json.loads((fixture / "model.safetensors.index.json").read_text())["weight_map"]
    return sorted({".".join(k.split(".")[:2]) if k.startswith("language_model") else k.split(".")[0] for k in keys})


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    from mlx_vlm.quant_utils import compute_bits_per_weight

    for fam, spec in FAMILIES.items():
        name = f"{fam}_mlx_q{BITS}"
        fixture = common.FIXTURES / name
        print(f"{name}:", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            base, edit_note = stage_base(fam, Path(tmp))
            # mlx-vlm on the unquantized base against the transformers goldens, stage by stage.
            agreement: dict[str, dict] = {}
            firsts: dict[str, str | None] = {}
            base_model, base_proc, base_backend = load(base, fam)
            copy_inputs(fam, base)
            for v in VARIANTS:
                g = run_variant(fam, base_model, base_proc, base, v, base_backend)
                g.meta["variant_name"] = v.name
                agreement[v.name], firsts[v.name] = compare_base(fam, g)
                print(f"  unquantized base vs transformers, {v.name}: {agreement[v.name]}", flush=True)
            probe = gemma3_mask_probe(base_model, base_proc, base) if fam == "gemma3" else None
            del base_model
            shutil.rmtree(base / "inputs")

            out = common.stage_dir(fixture, args.check)
            convert(base, out)
            copy_inputs(fam, out)
        if args.check:
            common.compare_checkpoint(out, fixture)

        model, processor, backend = load(fixture, fam)
        config = json.loads((fixture / "config.json").read_text())
        quant = config["quantization"]
        deq_notes, quantized, _ = weights_cross_check(fam, fixture)
        for v in VARIANTS:
            g = run_variant(fam, model, processor, fixture, v, backend)
            g.meta["unquantized_base_vs_transformers"] = agreement[v.name]
            if v.name == "long":
                assert g.meta["n_prompt_tokens"] > common.PREFILL_CHUNK
            common.write_golden(fixture, v.name, g, args.check)

        prefixes = top_prefixes(fixture)
        dense_prefixes = [p for p in prefixes if not p.startswith("language_model")]
        agree = [f"{v}: all stages within {AGREE_ATOL:g}, tokens and ids equal" if f is None else
                 f"{v}: first divergent stage {f}" for v, f in firsts.items()]
        causes = sorted({CAUSES[(fam, f)] for f in firsts.values() if (fam, f) in CAUSES})
        unexplained = sorted({f for f in firsts.values() if f is not None and (fam, f) not in CAUSES})
        if unexplained:
            raise RuntimeError(f"{fam}: mlx-vlm on the base diverges from transformers at {unexplained}, unexplained")
        notes = [
            f"made from tests/fixtures/{fam}_hub (tests/fixtures/{fam}'s weights byte for byte in the Hub's config "
            f"layout) by mlx_vlm.convert('<base>', mlx_path='tests/fixtures/{name}', quantize=True, "
            f"q_group_size={GROUP}, q_bits={BITS}, dtype='float32'), everything else mlx-vlm's default (quant_predicate "
            "None: skip_multimodal_module leaves vision and projector modules dense); group 64, the largest of 64/32 "
            "dividing every quantized input size",
            f"not from tests/fixtures/{fam} itself: mlx-vlm 0.7.10 cannot read its transformers 5 config: "
            + UNREADABLE[fam],
            *([f"<base> is tests/fixtures/{fam}_hub with one config edit: {edit_note}"] if edit_note else
              [f"<base> is tests/fixtures/{fam}_hub unchanged"]),
            quant_summary(quantized, quant, compute_bits_per_weight(model), dense_prefixes),
            "top-level key prefixes mlx-vlm writes: " + ", ".join(prefixes),
            mapping_note(fam),
            "layout conventions against the base: " + spec["layout_note"]
            + "; every other tensor keeps the base's shape and dtype (f32); nothing split or merged",
            *deq_notes,
            f"mlx-vlm on the unquantized base against tests/fixtures/{fam}'s transformers goldens (per variant and "
            "stage in the goldens' unquantized_base_vs_transformers): " + "; ".join(agree)
            + ("; cause: " + "; ".join(causes) if causes else "") + (f"; {probe}" if probe else ""),
            "preprocessing: " + {
                "qwen2_vl": "mlx-vlm's own Qwen2VLProcessor and image processor (numpy), whose pixel_values are "
                            "within 1e-6 of transformers' PIL backend (see unquantized_base_vs_transformers)",
                "gemma3": "mlx-vlm's Gemma3Processor around transformers' Gemma3ImageProcessorPil (pixel_values "
                          "exactly the base fixture's); it returns no token_type_ids (mlx-vlm does not use them)",
                "llava": "transformers' LlavaProcessor with the PIL backend (pixel_values exactly the base "
                         "fixture's): mlx-vlm 0.7.10's LlavaProcessor passes tokenizer arguments (padding, "
                         "padding_side) to transformers 5.24's image processor, which refuses them; stream_generate "
                         "gets the prepared input_ids, pixel_values and mask",
            }[fam],
            "prompt: the checkpoint's chat template rendered by mlx-vlm's processor"
            + (" (mlx-vlm's Gemma3Processor loads without it, so its tokenizer renders chat_template.jinja)"
               if fam == "gemma3" else "")
            + f"; prompt and input_ids equal tests/fixtures/{fam}'s (checked)",
            *(["mlx-vlm's gemma3 ModelConfig also defaults pad_token_id to 0 (Gemma 3 configs carry it only in "
               "text_config) and zeroes the embedding of every id 0 in a prompt with images; no prompt here has id 0"]
              if fam == "gemma3" else []),
            "inputs_embeds: what the first decoder layer receives"
            + (" (mlx-vlm's get_input_embeddings output, image rows divided by sqrt(hidden), times sqrt(hidden) "
               "rounded to bf16, as its Gemma3Model does)" if fam == "gemma3" else ""),
            "stages not recorded: attention masks (mlx-vlm builds its causal and sliding masks inside the decoder)"
            + ("; mm_token_type_ids (mlx-vlm's processor returns none)" if fam == "qwen2_vl" else "")
            + ("; token_type_ids (mlx-vlm's processor returns none)" if fam == "gemma3" else ""),
            "greedy tokens: mlx-vlm's cached decode (prompt with its position metadata, then a token at a time), "
            "mlx_vlm.stream_generate (temperature 0.0, EOS not stopping; its prefill is chunked) and full "
            "recomputation agree on all 16; stream_generate's streaming detokenizer is replaced by a null one for "
            "the comparison (the tiny tokenizer has fewer ids than the 448 embedding rows, and a generated id past "
            "its table raises IndexError there; only the text is affected, not the token ids)",
            "README.md is mlx-vlm's model card (front matter only, no paths); tokenizer_config.json is as mlx-vlm "
            "saves it (transformers adds is_local and local_files_only); the images in inputs/ are the base "
            "fixture's",
        ]
        common.write_provenance(
            fixture, "gen_mlx_vlm_quant.py",
            f"mlx-vlm {gen_mlx_quant.mlx_version('mlx-vlm')} load + stream_generate on mlx-cpu "
            f"{gen_mlx_quant.mlx_version('mlx-cpu')}, float32, greedy",
            {v.name: v.description for v in VARIANTS}, args.check,
            extra_versions=("mlx", "mlx-cpu", "mlx-vlm"), notes=notes,
        )
        common.finish(fixture)


if __name__ == "__main__":
    main()
