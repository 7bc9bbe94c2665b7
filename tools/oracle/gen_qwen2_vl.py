"""Tiny random-weight Qwen2-VL (Qwen2VLForConditionalGeneration) and its goldens: tests/fixtures/qwen2_vl.

Stages: pixel_values + image_grid_thw (PIL backend), vision_hidden (ViT blocks, before the merger),
image_features (after PatchMerger, the rows placed at <|image_pad|>), merged inputs_embeds, M-RoPE
position_ids [3, N], rope_delta, logits, 16 cached greedy tokens. Besides the standard variants, the wide picture
sent as a client would send it (common.client_formats): a JPEG, a lossy WebP and an EXIF-rotated JPEG, each
read by transformers' load_image from its file."""

import common
from transformers import (
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
IDS = common.special_ids(SPECIALS)

# ChatML; an image item becomes <|vision_start|><|image_pad|><|vision_end|>, which the processor expands.
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{%- if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Sizes chosen so smart_resize really resizes (not multiples of 28) and grids differ in h and w.
IMAGES = {"wide": (100, 60, 0), "tall": (50, 90, 1)}
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112


def text_config(**over) -> dict:
    cfg = dict(
        vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        bos_token_id=IDS["<|endoftext|>"], eos_token_id=IDS["<|im_end|>"], pad_token_id=IDS["<|endoftext|>"],
    )
    cfg.update(over)
    return cfg


def processor(processor_cls=Qwen2VLProcessor, video_cls=Qwen2VLVideoProcessor, patch_size=14, **image_kw):
    """The Qwen-VL processor family: ChatML template, smart_resize image processor (PIL), video processor."""
    kw = dict(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=patch_size, temporal_patch_size=2,
              merge_size=2)
    kw.update(image_kw)
    tok = common.hf_tokenizer(SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    video = video_cls(patch_size=patch_size, temporal_patch_size=2, merge_size=2)
    return processor_cls(image_processor=Qwen2VLImageProcessorPil(**kw), tokenizer=tok, video_processor=video,
                         chat_template=CHAT_TEMPLATE)


def encoder(model, inputs):
    out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    return {"vision_hidden": out.last_hidden_state, "image_features": common.torch.cat(out.pooler_output)}


def record_rope_delta(model, inputs, g) -> None:
    """M-RoPE: decode positions are text positions plus this delta (max position + 1 - prompt length)."""
    g.meta["rope_delta"] = int(model.model.rope_deltas.reshape(-1)[0]) if model.model.rope_deltas is not None else 0


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    config = Qwen2VLConfig(
        text_config=text_config(),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = common.randomize(Qwen2VLForConditionalGeneration(config))
    images = {k: common.synthetic_image(w, h, kind) for k, (w, h, kind) in IMAGES.items()}
    encoded, client_variants = common.client_formats(images["wide"], "wide")
    common.vlm_fixture(
        "qwen2_vl", "gen_qwen2_vl.py", model, processor(), {**images, **encoded},
        common.standard_variants("tall", "wide") + client_variants,
        check=args.check, encoder=encoder, position_rows=3, extra=record_rope_delta,
    )


if __name__ == "__main__":
    main()
