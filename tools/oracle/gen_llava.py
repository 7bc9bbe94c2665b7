"""Tiny random-weight LLaVA 1.5 style VLM (LlavaForConditionalGeneration) and its goldens: tests/fixtures/llava.

CLIP vision tower, features from the second-to-last layer with the CLS row dropped
(vision_feature_layer=-2, strategy "default"), a two-layer GELU projector, and a llama decoder.

Stages: pixel_values (shortest-edge resize + centre crop, PIL backend), vision_hidden (the selected CLIP
layer without CLS), image_features (projector output, the rows placed at <image>), inputs_embeds,
position_ids, logits, 16 cached greedy tokens. Besides the standard variants, the wide picture as a client would
send it (common.client_formats): a JPEG, a lossy WebP and an EXIF-rotated JPEG."""

import common
from transformers import CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

SPECIALS = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]
IDS = common.special_ids(SPECIALS)
SEQ = 16  # (56 / 14)^2 patches, CLS dropped

# llava-1.5 conversation layout: "USER: <image>\n... ASSISTANT:"; images come before the text of a turn.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}{% if m['role'] != 'system' %}{{ m['role'] | upper }}: {% endif %}"
    "{%- if m['content'] is string %}{{ m['content'] }} {% else %}"
    "{%- for c in m['content'] if c['type'] == 'image' %}<image>\n{% endfor %}"
    "{%- for c in m['content'] if c['type'] == 'text' %}{{ c['text'] }} {% endfor %}{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}ASSISTANT:{% endif %}"
)
IMAGES = {"wide": (100, 60, 0), "tall": (50, 90, 1)}


def encoder(model, inputs):
    cfg = model.config
    out = model.model.get_image_features(
        inputs["pixel_values"], vision_feature_layer=cfg.vision_feature_layer,
        vision_feature_select_strategy=cfg.vision_feature_select_strategy, output_hidden_states=True,
    )
    selected = out.hidden_states[cfg.vision_feature_layer][:, 1:]
    return {"vision_hidden": selected, "image_features": common.torch.cat(out.pooler_output)}


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    config = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=3, num_attention_heads=2, image_size=56, patch_size=14,
                           projection_dim=32, hidden_act="quick_gelu"),
        text_config=dict(model_type="llama", vocab_size=448, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         bos_token_id=IDS["<s>"], eos_token_id=IDS["</s>"], pad_token_id=IDS["<pad>"]),
        image_token_index=IDS["<image>"], image_seq_length=SEQ, projector_hidden_act="gelu",
        vision_feature_select_strategy="default", vision_feature_layer=-2, tie_word_embeddings=False,
    )
    model = common.randomize(LlavaForConditionalGeneration(config))
    tok = common.hf_tokenizer(SPECIALS, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                              image_token="<image>")
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               image_token="<image>", chat_template=CHAT_TEMPLATE)
    images = {k: common.synthetic_image(w, h, kind) for k, (w, h, kind) in IMAGES.items()}
    encoded, client_variants = common.client_formats(images["wide"], "wide")
    common.vlm_fixture(
        "llava", "gen_llava.py", model, processor, {**images, **encoded},
        common.standard_variants("tall", "wide") + client_variants,
        check=args.check, encoder=encoder,
    )


if __name__ == "__main__":
    main()
