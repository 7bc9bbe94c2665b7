"""Tiny random-weight Youtu-VL and its goldens, with mlx-vlm on mlx-cpu as the reference:
tests/fixtures/youtu_vl.

transformers has no Youtu-VL (only the text Youtu-LLM), so mlx-vlm 0.7.10 (models/youtu_vl) is the
reference: a SigLIP2 ViT with 2-D vision RoPE and window attention (window 64 px = 2x2 merged units in
block 0, full attention in block 1), post-layernorm, a 2x2 patch merger, and Youtu-LLM (MLA attention:
q and kv low-rank projections, decoupled RoPE heads, interleaved rotary, tied embeddings).

The checkpoint is in the Hugging Face layout mlx-vlm's sanitize reads: siglip2.vision_model.*, merger.*,
model.* and the fused kv_b_proj (which mlx-vlm splits into per-head embed_q / unembed_out).

**Preprocessing has no reference.** Real checkpoints use a remote-code processor that neither transformers
nor mlx-vlm ships. pixel_values here come from a documented stand-in (see `preprocess`): PIL bicubic resize
to multiples of 32 px, rescale and normalise to [-1, 1], 16 px patches flattened (row, column, channel) and
ordered by 2x2 merge unit, as the tower's rotary and window indexing assume. The encoder and decoder
goldens are exact for these pixels; a processor implementation cannot be qualified from this fixture.

Besides the four standard variants, the wide picture as a client would send it (common.client_formats): a JPEG
(4:2:0, quality 90), a lossy WebP (quality 80) and a JPEG stored a quarter turn off with EXIF orientation 6. Their
goldens start from the file as decoded (Pillow, ImageOps.exif_transpose, convert("RGB"): transformers' load_image,
checked equal to mlx-vlm's load_image, gen_molmo.read_image), then the stand-in preprocessing as for a PNG.

Stages: pixel_values, spatial_shapes, image_features (merger output, the rows placed at <|image_pad|>),
inputs_embeds, position_ids, attention_mask.full_attention (the language model's own causal mask), logits, 16
greedy tokens decoded with the KV cache."""

import json

import common
import gen_molmo
import gen_qwen2_vl
import mlx.core as mx
import numpy as np
import torch
from mlx.utils import tree_flatten
from safetensors.numpy import save_file

# Qwen-style ChatML specials and template, as in the Qwen-VL fixtures.
SPECIALS, IDS, CHAT_TEMPLATE = gen_qwen2_vl.SPECIALS, gen_qwen2_vl.IDS, gen_qwen2_vl.CHAT_TEMPLATE
PATCH, MERGE = 16, 2
MIN_SIDE, MAX_SIDE = 64, 128

CONFIG = {
    "model_type": "youtu_vl", "architectures": ["YoutuVLForConditionalGeneration"],
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "vocab_size": 400, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
    "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 16, "qk_nope_head_dim": 16,
    "rope_theta": 10000.0, "rope_interleave": True, "tie_word_embeddings": True,
    "vision_config": {"model_type": "siglip2_vision_model", "hidden_size": 32, "out_hidden_size": 64,
                      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "num_patches": 64, "patch_size": PATCH, "spatial_merge_size": MERGE, "window_size": 64,
                      "fullatt_block_indexes": [1]},
    "image_token_id": IDS["<|image_pad|>"], "video_token_id": IDS["<|video_pad|>"],
    "vision_start_token_id": IDS["<|vision_start|>"], "vision_end_token_id": IDS["<|vision_end|>"],
    "bos_token_id": IDS["<|endoftext|>"], "eos_token_id": [IDS["<|im_end|>"]], "pad_token_id": IDS["<|endoftext|>"],
}
IMAGES = {"wide": (100, 60, 0), "tall": (50, 90, 1)}
# The wide picture as clients send it: a JPEG, a lossy WebP, an EXIF-rotated JPEG (one single-image variant each).
ENCODED, CLIENT_VARIANTS = common.client_formats(common.synthetic_image(*IMAGES["wide"]), "wide")
# Each media name's file under the fixture.
FILES = {**{k: f"inputs/{k}.png" for k in IMAGES}, **{k: f"inputs/{k}.{e.ext}" for k, e in ENCODED.items()}}
NOTES = [
    "transformers has no Youtu-VL; mlx-vlm is the reference and there is no second implementation",
    "pixel_values come from a stand-in preprocessing (no reference processor is available): "
    "the encoder and decoder goldens are exact for them, the preprocessing stage is not qualified",
    "kv_b_proj is stored fused, as in Hugging Face checkpoints; mlx-vlm splits it on load",
    "image_jpeg, image_webp, image_jpeg_exif: inputs/wide_jpeg.jpg, inputs/wide_webp.webp, inputs/wide_exif.jpg (the "
    "wide picture as a JPEG 4:2:0 quality 90, a lossy WebP quality 80, a JPEG stored a quarter turn off with EXIF "
    "orientation 6); their goldens start from the decoded file (transformers' load_image, checked equal to mlx-vlm's "
    "load_image), then the stand-in preprocessing",
]


def variants() -> list[common.Variant]:
    return common.standard_variants("tall", "wide") + CLIENT_VARIANTS


def to_hf(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """mlx-vlm's module names -> the Hugging Face checkpoint names (the inverse of YoutuVL.sanitize)."""
    tc = CONFIG
    out = {}
    for k, v in weights.items():
        if k.startswith("vision_tower.merger."):
            k = k.removeprefix("vision_tower.")
        elif k.startswith("vision_tower."):
            k = "siglip2.vision_model." + k.removeprefix("vision_tower.")
        elif k.startswith("language_model.model."):
            k = "model." + k.removeprefix("language_model.model.")
        elif k.startswith("language_model.lm_head."):
            continue  # tied
        out[k] = v
    for layer in range(tc["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.self_attn"
        wk = out.pop(f"{prefix}.embed_q.weight")  # [heads, kv_lora_rank, qk_nope]
        wv = out.pop(f"{prefix}.unembed_out.weight")  # [heads, v_head, kv_lora_rank]
        fused = np.concatenate([wk.swapaxes(-1, -2), wv], axis=1)
        out[f"{prefix}.kv_b_proj.weight"] = np.ascontiguousarray(fused.reshape(-1, fused.shape[-1]))
    return out


def build(out) -> None:
    import mlx_vlm.models.youtu_vl as youtu
    from mlx_vlm.utils import update_module_configs

    mx.random.seed(common.SEED)
    raw = json.loads(json.dumps(CONFIG))
    cfg = youtu.ModelConfig.from_dict(raw)
    cfg = update_module_configs(cfg, youtu, raw, ["text", "vision"])
    model = youtu.Model(cfg)
    common.randomize_mlx(model)
    weights = to_hf({k: np.array(v) for k, v in tree_flatten(model.parameters())})
    save_file(dict(sorted(weights.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_bytes(common.json_bytes(CONFIG))
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.save_pretrained(out)
    write_inputs(out)


def write_inputs(out) -> None:
    """inputs/: the PNG pictures and the client-encoded files, the same bytes for every Youtu-VL fixture."""
    for name, (w, h, kind) in IMAGES.items():
        common.save_image(common.synthetic_image(w, h, kind), out, name)
    for name, enc in ENCODED.items():
        common.save_encoded(enc, out, name)


def preprocess(img) -> tuple[np.ndarray, tuple[int, int]]:
    """The stand-in processor (no reference exists): returns [patches, 16*16*3] and the patch grid (h, w)."""
    from PIL import Image

    unit = PATCH * MERGE
    w, h = img.size
    th = min(max(round(h / unit) * unit, MIN_SIDE), MAX_SIDE)
    tw = min(max(round(w / unit) * unit, MIN_SIDE), MAX_SIDE)
    x = np.asarray(img.resize((tw, th), Image.Resampling.BICUBIC), dtype=np.float32) / np.float32(255.0)
    x = (x - np.float32(0.5)) / np.float32(0.5)
    gh, gw = th // PATCH, tw // PATCH
    # [gh/2, 2, P, gw/2, 2, P, C] -> merge units in raster order, 2x2 patches inside each, (row, col, channel)
    x = x.reshape(gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH, 3).transpose(0, 3, 1, 4, 2, 5, 6)
    return np.ascontiguousarray(x.reshape(gh * gw, PATCH * PATCH * 3)), (gh, gw)


def run_variant(model, tok, fixture, v: common.Variant) -> common.Golden:
    messages = v.messages()
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    imgs = [gen_molmo.read_image(fixture, FILES[i]) for i in v.media("image")]
    prepared = [preprocess(im) for im in imgs]
    # Expand each image placeholder to one <|image_pad|> per merged 2x2 unit, then tokenize once.
    pieces = prompt.split("<|image_pad|>")
    text = pieces[0]
    for (_, (gh, gw)), rest in zip(prepared, pieces[1:]):
        text += "<|image_pad|>" * (gh * gw // MERGE**2) + rest
    ids = mx.array([tok(text, add_special_tokens=False)["input_ids"]])
    pixels = mx.array(np.concatenate([p for p, _ in prepared])[None]) if prepared else None
    shapes = mx.array([list(s) for _, s in prepared]) if prepared else None
    kwargs = {"spatial_shapes": shapes} if prepared else {}

    def embed(token_ids):
        return model.get_input_embeddings(token_ids, pixels, **kwargs).inputs_embeds

    g = common.mlx_reference_goldens(model, ids, embed, pixels, kwargs)
    common.mlx_prompt_mask(g, ids.shape[1])
    if prepared:
        g.put("pixel_values", torch.from_numpy(np.array(pixels[0])))
        g.put("spatial_shapes", torch.from_numpy(np.array(shapes)))
        g.put("image_features", torch.from_numpy(np.array(model.vision_tower(pixels, shapes))))
        g.meta.update(images=[FILES[i] for i in v.media("image")],
                      image_sizes=[list(im.size) for im in imgs],
                      image_backend="stand-in (no reference processor): PIL bicubic, see gen_youtu_vl.preprocess")
    g.meta.update(messages=messages, prompt=prompt, expanded_prompt=text)
    return g


def load_tokenizer(fixture):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(fixture)


def main() -> None:
    args = common.parse_args(__doc__)
    common.mlx_fixture(
        "youtu_vl", "gen_youtu_vl.py", build, load_tokenizer, run_variant, variants(), check=args.check,
        reference="mlx-vlm YoutuVL (models/youtu_vl) on mlx-cpu, fp32; stand-in preprocessing", notes=NOTES,
    )


if __name__ == "__main__":
    main()
