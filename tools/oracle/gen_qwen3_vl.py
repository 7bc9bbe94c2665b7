"""Tiny random-weight Qwen3-VL (Qwen3VLForConditionalGeneration) and its goldens: tests/fixtures/qwen3_vl.

Patch 16, a learned 4x4 position-embedding grid bilinearly interpolated to each image's grid, DeepStack
(vision blocks 0 and 1 feed text layers 0 and 1), a qwen3 decoder (QK-norm) with interleaved M-RoPE
(mrope_section [6, 5, 5] over head_dim 32).

Stages: pixel_values + image_grid_thw, vision_hidden (last block, patch order), image_features (merger
output), deepstack_features.<i> (the rows added to text layer i's output at image positions),
inputs_embeds, position_ids [3, N], rope_delta, logits, 16 cached greedy tokens."""

import common
import gen_qwen2_vl
from transformers import (
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

IDS = gen_qwen2_vl.IDS
# With patch 16 and merge 2 smart_resize rounds to multiples of 32: wide 100x60 -> 96x64 (grid 4x6),
# tall 50x90 -> 64x96 (grid 6x4).
MIN_PIXELS, MAX_PIXELS = 64 * 64, 128 * 128


def encoder(model, inputs):
    out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    stages = {"vision_hidden": out.last_hidden_state, "image_features": common.torch.cat(out.pooler_output)}
    for i, feats in enumerate(out.deepstack_features):
        stages[f"deepstack_features.{i}"] = common.torch.cat(feats)
    return stages


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    text = gen_qwen2_vl.text_config(
        head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5],
                                      "mrope_interleaved": True},
    )
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                           deepstack_visual_indexes=[0, 1], in_channels=3),
        image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = common.randomize(Qwen3VLForConditionalGeneration(config))
    processor = gen_qwen2_vl.processor(
        Qwen3VLProcessor, Qwen3VLVideoProcessor, patch_size=16, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
        image_mean=[0.5] * 3, image_std=[0.5] * 3,
    )
    images = {k: common.synthetic_image(w, h, kind) for k, (w, h, kind) in gen_qwen2_vl.IMAGES.items()}
    encoded, client_variants = common.client_formats(images["wide"], "wide")
    common.vlm_fixture(
        "qwen3_vl", "gen_qwen3_vl.py", model, processor, {**images, **encoded},
        common.standard_variants("tall", "wide") + client_variants,
        check=args.check, encoder=encoder, position_rows=3, extra=gen_qwen2_vl.record_rope_delta,
    )


if __name__ == "__main__":
    main()
