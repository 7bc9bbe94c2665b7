"""Tiny random-weight Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration) and its goldens: tests/fixtures/qwen2_5_vl.

Differs from Qwen2-VL in the vision tower: RMSNorm, SwiGLU MLP, window attention (window_size 56 = 2x2
merged units) in block 0 and full attention in block 1 (fullatt_block_indexes), tokens reordered into
windows and back. The "tall" image's 3x2 merged grid needs window padding.

Stages as for Qwen2-VL: pixel_values + image_grid_thw, vision_hidden (the last block's output, moved from
window order back to the processor's patch order), image_features (merger output, patch order),
inputs_embeds, position_ids [3, N], rope_delta, logits, 16 cached greedy tokens."""

import common
import gen_qwen2_vl
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
from transformers.vision_utils import get_vision_window_index

IDS = gen_qwen2_vl.IDS


def encoder(model, inputs):
    """Like Qwen2-VL's, but the tower's last_hidden_state is in window order: undo that permutation (it moves
    whole merge units of spatial_merge_size^2 patches) so the golden is in patch order."""
    stages = gen_qwen2_vl.encoder(model, inputs)
    visual = model.model.visual
    window_index, _ = get_vision_window_index(
        inputs["image_grid_thw"], spatial_merge_size=visual.spatial_merge_size, window_size=visual.window_size,
        patch_size=visual.patch_size,
    )
    h = stages["vision_hidden"]
    units = h.reshape(-1, visual.spatial_merge_unit, h.shape[-1])
    stages["vision_hidden"] = units[common.torch.argsort(window_index)].reshape(h.shape)
    return stages


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    config = Qwen2_5_VLConfig(
        text_config=gen_qwen2_vl.text_config(),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                           fullatt_block_indexes=[1], tokens_per_second=2, hidden_act="silu", in_channels=3),
        image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
        vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = common.randomize(Qwen2_5_VLForConditionalGeneration(config))
    images = {k: common.synthetic_image(w, h, kind) for k, (w, h, kind) in gen_qwen2_vl.IMAGES.items()}
    encoded, client_variants = common.client_formats(images["wide"], "wide")
    common.vlm_fixture(
        "qwen2_5_vl", "gen_qwen2_5_vl.py", model, gen_qwen2_vl.processor(Qwen2_5_VLProcessor), {**images, **encoded},
        common.standard_variants("tall", "wide") + client_variants, check=args.check, encoder=encoder, position_rows=3,
        extra=gen_qwen2_vl.record_rope_delta,
    )


if __name__ == "__main__":
    main()
