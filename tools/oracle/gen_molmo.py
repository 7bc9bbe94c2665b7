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
ALLENAI_PREFIXES = [("language_model.model.", "model.transformer."), ("vision_tower.", "model.vision_backbone.")]


def variants() -> list[common.Variant]:
    return [
        common.Variant("image", "one non-square image (wide)", [("image", "wide"), common.SHORT_PROMPT]),
        common.Variant("text_only", "a text-only prompt to the VLM checkpoint", [common.TEXT_PROMPT]),
        common.Variant("long", f"an image and a prompt longer than one prefill chunk of {common.PREFILL_CHUNK}",
                       [("image", "wide"), common.LONG_PROMPT]),
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
    for name, (w, h, kind) in IMAGES.items():
        common.save_image(common.synthetic_image(w, h, kind), out, name)


def run_variant(model, processor, fixture, v: common.Variant) -> common.Golden:
    messages = v.messages()
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    imgs = [common.load_image(fixture, f"inputs/{i}.png") for i in v.media("image")]
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
        g.put("image_features", torch.from_numpy(np.array(feats[0])))
        g.meta.update(images=[f"inputs/{i}.png" for i in v.media("image")],
                      image_sizes=[list(im.size) for im in imgs], image_backend="mlx-vlm MolmoImageProcessor (PIL)")
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
        notes=["transformers has no Molmo v1; mlx-vlm is the reference and there is no second implementation",
               "weights use the original allenai names; config.json is mlx-vlm's nested form",
               "mlx-vlm's Molmo processor takes one image per prompt: no two-image variant"],
    )


if __name__ == "__main__":
    main()
