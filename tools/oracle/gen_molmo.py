"""Tiny random-weight Molmo (v1) and its goldens, with mlx-vlm on mlx-cpu as the reference:
tests/fixtures/molmo.

transformers has no Molmo v1, so mlx-vlm 0.7.10 (models/molmo, and its MolmoProcessor) is the reference.
The checkpoint keeps the original allenai weight names (model.transformer.*, model.vision_backbone.*, which
mlx-vlm's sanitize maps); config.json and preprocessor_config.json are in the form mlx-vlm reads (nested
text_config / vision_config with Molmo's own key names).

The processor resizes (PIL bilinear) and pads into overlapping crops plus a global crop, and puts the image
tokens (<im_start> (<im_patch> x w <im_col>) x h <im_end>, for the global image then the crops) before the
prompt's text. mlx-vlm's Molmo processor takes one image per prompt, so there is no two-image variant. Besides
the image, long and text_only variants, image_jpeg sends the wide picture as a client would, a JPEG (4:2:0,
quality 90, common.client_formats); its goldens start from the JPEG as decoded (Pillow, exif_transpose, RGB),
which is the same for transformers' load_image and mlx-vlm's.

Stages: input_ids, pixel_values [crops, patches, 588], image_input_idx (token position of each pooled
feature, -1 for padding), image_masks, image_features (vision tower + pooling + projector output, in the order it is added
to the token embeddings: the rows image_input_idx places, by token position; image_features_by_crop holds
them per crop and pooled patch as the tower returns them), inputs_embeds, attention_mask.full_attention (the
language model's own mask, create_attention_mask as an array), position_ids, logits, 16 greedy tokens decoded with
the KV cache (make_prompt_cache), cross-checked against mlx-vlm's generate_step and full recomputation."""

import json

import common
import mlx.core as mx
import numpy as np
import torch
from mlx.utils import tree_flatten
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
# The wide picture as a client sends it: only the JPEG of common.client_formats (the processor takes one image).
_ENCODED, _CLIENT_VARIANTS = common.client_formats(common.synthetic_image(*IMAGES["wide"]), "wide")
ENCODED = {"wide_jpeg": _ENCODED["wide_jpeg"]}
JPEG_VARIANT = next(v for v in _CLIENT_VARIANTS if v.name == "image_jpeg")
# Each media name's file under the fixture.
FILES = {**{k: f"inputs/{k}.png" for k in IMAGES}, **{k: f"inputs/{k}.{e.ext}" for k, e in ENCODED.items()}}
ALLENAI_PREFIXES = [("language_model.model.", "model.transformer."), ("vision_tower.", "model.vision_backbone.")]


NOTES = [
    "transformers has no Molmo v1; mlx-vlm is the reference and there is no second implementation",
    "weights use the original allenai names; config.json is mlx-vlm's nested form",
    "mlx-vlm's Molmo processor takes one image per prompt: no two-image variant",
    "image_jpeg: inputs/wide_jpeg.jpg (the wide picture as JPEG, 4:2:0, quality 90); its goldens start from the "
    "decoded JPEG (transformers' load_image, checked equal to mlx-vlm's load_image)",
]


def variants() -> list[common.Variant]:
    return [
        common.Variant("image", "one non-square image (wide)", [("image", "wide"), common.SHORT_PROMPT]),
        common.Variant("text_only", "a text-only prompt to the VLM checkpoint", [common.TEXT_PROMPT]),
        common.Variant("long", f"an image and a prompt longer than one prefill chunk of {common.PREFILL_CHUNK}",
                       [("image", "wide"), common.LONG_PROMPT]),
        JPEG_VARIANT,
    ]


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
    common.randomize_mlx(model)
    weights = {to_allenai(k): np.array(v) for k, v in tree_flatten(model.parameters())}
    save_file(dict(sorted(weights.items())), str(out / "model.safetensors"), metadata={"format": "mlx"})
    (out / "config.json").write_bytes(common.json_bytes(CONFIG))
    (out / "preprocessor_config.json").write_bytes(common.json_bytes(PREPROCESSOR))
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.save_pretrained(out)
    write_inputs(out)


def write_inputs(out) -> None:
    """inputs/: the PNG pictures and the client-encoded files, the same bytes for every Molmo fixture."""
    for name, (w, h, kind) in IMAGES.items():
        common.save_image(common.synthetic_image(w, h, kind), out, name)
    for name, enc in ENCODED.items():
        common.save_encoded(enc, out, name)


def read_image(fixture, rel: str):
    """The image as the reference reads the file (common.load_image: transformers' load_image), checked to be
    what mlx-vlm's own load_image gives for it (both: Pillow, ImageOps.exif_transpose, convert("RGB"))."""
    from mlx_vlm.utils import load_image as mlx_load_image

    img = common.load_image(fixture, rel)
    if not np.array_equal(np.asarray(img), np.asarray(mlx_load_image(str(fixture / rel)))):
        raise RuntimeError(f"{rel}: transformers' load_image and mlx-vlm's decode it differently")
    return img


def run_variant(model, processor, fixture, v: common.Variant) -> common.Golden:
    messages = v.messages()
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    imgs = [read_image(fixture, FILES[i]) for i in v.media("image")]
    inputs = processor(images=imgs or None, text=prompt)
    extra = {k: inputs[k] for k in ("image_input_idx", "image_masks") if k in inputs}
    pixels = inputs.get("pixel_values")

    def embed(token_ids):
        return model.get_input_embeddings(token_ids, pixels, **extra).inputs_embeds

    g = common.mlx_reference_goldens(model, inputs["input_ids"], embed, pixels, extra)
    if pixels is not None:
        feats, _ = model.vision_tower(pixels[None], extra["image_masks"][None])
        g.put("pixel_values", torch.from_numpy(np.array(pixels)))
        g.put("image_input_idx", torch.from_numpy(np.array(extra["image_input_idx"])))
        g.put("image_masks", torch.from_numpy(np.array(extra["image_masks"])))
        # The rows as the merge adds them: each valid (crop, pooled patch) feature at its
        # image_input_idx, so in the order of the prompt's <im_patch> tokens (padding slots,
        # image_input_idx < 0, are never added). The per-crop tensor is kept beside it.
        by_crop = np.array(feats[0])
        idx = np.array(extra["image_input_idx"]).reshape(-1)
        rows = by_crop.reshape(idx.size, -1)[idx >= 0]
        placed = rows[np.argsort(idx[idx >= 0], kind="stable")]
        g.put("image_features", torch.from_numpy(placed))
        g.put("image_features_by_crop", torch.from_numpy(by_crop))
        g.meta.update(images=[FILES[i] for i in v.media("image")],
                      image_sizes=[list(im.size) for im in imgs], image_backend="mlx-vlm MolmoImageProcessor (PIL)")
    common.mlx_prompt_mask(g, int(inputs["input_ids"].shape[1]))
    g.meta.update(messages=messages, prompt=prompt, processor_outputs=sorted(k for k in inputs if k != "input_ids"))
    return g


def load_processor(fixture):
    from mlx_vlm.models.molmo.processing_molmo import MolmoProcessor

    return MolmoProcessor.from_pretrained(str(fixture))


def main() -> None:
    args = common.parse_args(__doc__)
    common.mlx_fixture(
        "molmo", "gen_molmo.py", build, load_processor, run_variant, variants(), check=args.check,
        reference="mlx-vlm Molmo (models/molmo) on mlx-cpu, fp32; mlx-vlm MolmoProcessor",
        notes=NOTES,
    )


if __name__ == "__main__":
    main()
