"""Tiny random-weight Molmo (v1) and its goldens, with mlx-vlm on mlx-cpu as the reference:
tests/fixtures/molmo.

transformers has no Molmo v1, so mlx-vlm 0.7.10 (models/molmo, and its MolmoProcessor) is the reference.
The checkpoint keeps the original allenai weight names (model.transformer.*, model.vision_backbone.*, which
mlx-vlm's sanitize maps); config.json and preprocessor_config.json are in the form mlx-vlm reads (nested
text_config / vision_config with Molmo's own key names).

The processor resizes (PIL bilinear) and pads into overlapping crops plus a global crop, and puts the image
tokens (<im_start> (<im_patch> x w <im_col>) x h <im_end>, for the global image then the crops) before the
prompt's text. mlx-vlm's Molmo processor takes one image per prompt, so there is no two-image variant.

Stages: input_ids, pixel_values [crops, patches, 588], image_input_idx (token position of each pooled
feature, -1 for padding), image_masks, image_features (vision tower + pooling + projector output, added to
the token embeddings at image_input_idx), inputs_embeds, position_ids, logits, 16 greedy tokens decoded with
the KV cache (make_prompt_cache), cross-checked against mlx-vlm's generate_step and full recomputation."""

import json
import shutil

import common
import mlx.core as mx
import numpy as np
import torch
from mlx.utils import tree_flatten, tree_unflatten
from safetensors.numpy import save_file

SPECIALS = ["<|endoftext|>", "<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<|image|>"]
IDS = common.special_ids(SPECIALS)
VOCAB = common.BASE_VOCAB + 1  # <|endoftext|> is in the base vocabulary; the image tokens are "additional"
ADDITIONAL_VOCAB = 16

CONFIG = {
    "model_type": "molmo",
    "text_config": {
        "model_type": "molmo", "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2,
        "mlp_hidden_size": 256, "act_output_multiplier": 0.5, "vocab_size": VOCAB, "embedding_size": VOCAB,
        "additional_vocab_size": ADDITIONAL_VOCAB, "max_position_embeddings": 512, "max_sequence_length": 512,
        "rope_theta": 10000.0, "layer_norm_eps": 1e-6, "weight_tying": False,
    },
    "vision_config": {
        "model_type": "molmo", "image_default_input_size": [112, 112], "image_patch_size": 14,
        "image_pos_patch_size": 14, "hidden_size": 128, "image_emb_dim": 32, "image_num_heads": 2,
        "image_num_key_value_heads": 2, "image_num_layers": 3, "image_head_dim": 16, "image_mlp_dim": 64,
        "image_mlp_activations": "gelu", "image_num_pos": 65, "image_norm_eps": 1e-5, "d_model": 64,
        "image_pooling_h": 2, "image_pooling_w": 2, "vit_layers": [-1, -2], "image_pooling_2d": "attention-meanq",
        "image_padding_embed": "pad_and_partial_pad",
    },
    "eos_token_id": [IDS["<|endoftext|>"]],
}
PREPROCESSOR = {
    "max_crops": 4, "overlap_margins": [2, 2], "base_image_input_size": [112, 112],
    "image_token_length_w": 4, "image_token_length_h": 4, "image_patch_size": 14, "image_padding_mask": True,
    "do_normalize": True,
}
# Molmo's "User: ... Assistant:" layout; the processor puts the image tokens first, so an image item
# renders nothing here.
CHAT_TEMPLATE = (
    "{%- for m in messages %}{% if m['content'] is string %}{% set text = m['content'] %}{% else %}"
    "{% set text = m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{% endif %}{{ 'User' if m['role'] == 'user' else 'Assistant' }}: {{ text }}\n{% endfor %}"
    "{%- if add_generation_prompt %}Assistant:{% endif %}"
)
IMAGES = {"wide": (100, 60, 0)}
ALLENAI_PREFIXES = [("language_model.model.", "model.transformer."), ("vision_tower.", "model.vision_backbone.")]


def variants() -> list[common.Variant]:
    return [
        common.Variant("image", "one non-square image (wide)", [("image", "wide"), common.SHORT_PROMPT]),
        common.Variant("text_only", "a text-only prompt to the VLM checkpoint", [common.TEXT_PROMPT]),
        common.Variant("long", f"an image and a prompt longer than one prefill chunk of {common.PREFILL_CHUNK}",
                       [("image", "wide"), common.LONG_PROMPT]),
    ]


def randomize(model, seed: int = common.SEED + 1, vec_std: float = 0.1) -> None:
    """common.randomize for an mlx module: matrices N(0, 1/fan_in), vectors default + N(0, vec_std)."""
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


def to_allenai(name: str) -> str:
    for ours, theirs in ALLENAI_PREFIXES:
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return name


def build(out) -> None:
    import mlx_vlm.models.molmo as molmo
    from mlx_vlm.utils import update_module_configs

    mx.random.seed(common.SEED)
    cfg = molmo.ModelConfig.from_dict(CONFIG)
    cfg = update_module_configs(cfg, molmo, json.loads(json.dumps(CONFIG)), ["text", "vision"])
    model = molmo.Model(cfg)
    randomize(model)
    weights = {to_allenai(k): np.array(v) for k, v in tree_flatten(model.parameters())}
    save_file(dict(sorted(weights.items())), str(out / "model.safetensors"), metadata={"format": "mlx"})
    (out / "config.json").write_bytes(common.json_bytes(CONFIG))
    (out / "preprocessor_config.json").write_bytes(common.json_bytes(PREPROCESSOR))
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.save_pretrained(out)
    for name, (w, h, kind) in IMAGES.items():
        common.save_image(common.synthetic_image(w, h, kind), out, name)


def t(x) -> torch.Tensor:
    return torch.from_numpy(np.array(x))


def run_variant(model, processor, fixture, v: common.Variant) -> common.Golden:
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models.cache import make_prompt_cache

    messages = v.messages()
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    imgs = [common.load_image(fixture, f"inputs/{i}.png") for i in v.media("image")]
    inputs = processor(images=imgs or None, text=prompt)
    ids = inputs["input_ids"]
    extra = {k: inputs[k] for k in ("image_input_idx", "image_masks") if k in inputs}
    pixels = inputs.get("pixel_values")
    lm = model.language_model

    def embed(token_ids):
        return model.get_input_embeddings(token_ids, pixels, **extra).inputs_embeds

    g = common.Golden()
    g.put("input_ids", t(ids[0]))
    if pixels is not None:
        g.put("pixel_values", t(pixels))
        g.put("image_input_idx", t(extra["image_input_idx"]))
        g.put("image_masks", t(extra["image_masks"]))
        feats, _ = model.vision_tower(pixels[None], extra["image_masks"][None])
        g.put("image_features", t(feats[0]))
    emb = embed(ids)
    n = ids.shape[1]
    g.put("inputs_embeds", t(emb[0]))
    g.put("position_ids", torch.arange(n))
    logits = lm(ids, inputs_embeds=emb).logits
    g.put("logits", t(logits[0]))

    # Greedy with the KV cache: prefill once, then one token at a time through the cache.
    cache = make_prompt_cache(lm)
    step = lm(ids, inputs_embeds=emb, cache=cache).logits[0, -1]
    tokens, steps = [], []
    for _ in range(common.GREEDY_TOKENS):
        mx.eval(step)
        steps.append(np.array(step))
        tokens.append(int(np.argmax(steps[-1])))
        step = lm(mx.array([[tokens[-1]]]), cache=cache).logits[0, -1]
    # Cross-checks: mlx-vlm's own greedy generate, and greedy by full recomputation.
    gen = generate_step(ids, model, pixels, None, temperature=0.0, max_tokens=common.GREEDY_TOKENS, **extra)
    ref = [int(tok) for (tok, _), _ in zip(gen, range(common.GREEDY_TOKENS))]
    cur = ids
    for tok in tokens:
        nxt = int(np.argmax(np.array(lm(cur, inputs_embeds=embed(cur)).logits[0, -1])))
        if nxt != tok:
            raise RuntimeError(f"cached greedy {tokens} diverges from full recompute at {tok} vs {nxt}")
        cur = mx.concatenate([cur, mx.array([[tok]], dtype=cur.dtype)], axis=1)
    if ref != tokens:
        raise RuntimeError(f"cached greedy {tokens} != mlx-vlm generate_step {ref}")
    step_logits = torch.from_numpy(np.stack(steps))
    top2 = step_logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    if float(margins.min()) < common.MIN_GREEDY_MARGIN:
        raise RuntimeError(f"greedy margin {float(margins.min()):.2e} too small: pick another prompt")
    g.put("greedy_tokens", torch.tensor(tokens))
    g.put("decode_logits", step_logits)
    g.put("greedy_margins", margins)
    g.meta.update(
        n_prompt_tokens=n, input_ids=np.array(ids[0]).tolist(), greedy_tokens=tokens,
        min_greedy_margin=float(margins.min()), prefill_chunks=-(-n // common.PREFILL_CHUNK),
        messages=messages, prompt=prompt, processor_outputs=sorted(k for k in inputs if k != "input_ids"),
    )
    if imgs:
        g.meta.update(images=[f"inputs/{i}.png" for i in v.media("image")],
                      image_sizes=[list(im.size) for im in imgs], image_backend="mlx-vlm MolmoImageProcessor (PIL)")
    return g


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    fixture = common.FIXTURES / "molmo"
    print("molmo:", flush=True)
    out = common.stage_dir(fixture, args.check)
    build(out)
    if args.check:
        common.compare_checkpoint(out, fixture)

    from mlx_vlm.models.molmo.processing_molmo import MolmoProcessor
    from mlx_vlm.utils import load_model

    model = load_model(fixture)
    processor = MolmoProcessor.from_pretrained(str(fixture))
    vs = variants()
    for v in vs:
        common.write_golden(fixture, v.name, run_variant(model, processor, fixture, v), args.check)
    common.write_provenance(
        fixture, "gen_molmo.py", "mlx-vlm Molmo (models/molmo) on mlx-cpu, fp32; mlx-vlm MolmoProcessor",
        {v.name: v.description for v in vs}, args.check, extra_versions=("mlx", "mlx-cpu", "mlx-vlm"),
        notes=["transformers has no Molmo v1; mlx-vlm is the reference and there is no second implementation",
               "weights use the original allenai names; config.json is mlx-vlm's nested form",
               "mlx-vlm's Molmo processor takes one image per prompt: no two-image variant"],
    )
    common.finish(fixture)
    shutil.rmtree(fixture / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
