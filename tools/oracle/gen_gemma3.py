"""Tiny random-weight Gemma3 VLM (Gemma3ForConditionalGeneration) and its goldens: tests/fixtures/gemma3.

SigLIP tower (with post_layernorm) -> average pool to mm_tokens_per_image -> Gemma RMSNorm (1 + w) ->
projection; text embeddings scaled by sqrt(hidden), image rows placed unscaled; attention is causal plus
bidirectional inside each image block (token_type_ids), combined with the sliding-window layers.

Stages: pixel_values, token_type_ids, vision_hidden (SigLIP last_hidden_state, post_layernorm applied),
image_features (projector output), inputs_embeds, position_ids, attention masks (sliding and full, with the
image blocks), logits, 16 cached greedy tokens. The Gemma3 projector's default initialisation is zero, which
would disconnect the image entirely; every weight is redrawn. Besides the standard variants, the wide picture as a
client would send it (common.client_formats): a JPEG, a lossy WebP and an EXIF-rotated JPEG."""

import common
import gen_gemma3_text
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
)

SPECIALS = gen_gemma3_text.SPECIALS + ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
IDS = common.special_ids(SPECIALS)
MM_TOKENS = 16  # 8x8 SigLIP patches, average-pooled 2x2 -> 4x4

# Gemma turn layout; an image item becomes <start_of_image>, which the processor expands to
# "\n\n<start_of_image>" + <image_soft_token> x 16 + "<end_of_image>\n\n".
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}{% for c in m['content'] %}"
    "{%- if c['type'] == 'image' %}<start_of_image>{% elif c['type'] == 'text' %}{{ c['text'] | trim }}{% endif %}"
    "{%- endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
NOTES = [
    "sliding layers: the mask is (causal AND within the window) OR (same image block), so an image token "
    "attends to later tokens of its own block even beyond the window; see attention_mask.sliding_attention",
    "the processor's token_type_ids (1 on image soft tokens) drive the bidirectional image blocks",
]
IMAGES = {"wide": (100, 60, 0), "tall": (50, 90, 1)}


def encoder(model, inputs):
    out = model.model.get_image_features(inputs["pixel_values"])
    return {"vision_hidden": out.last_hidden_state, "image_features": out.pooler_output.flatten(0, 1)}


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    config = Gemma3Config(
        text_config=gen_gemma3_text.text_config(),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=112, patch_size=14, vision_use_head=False, layer_norm_eps=1e-6),
        mm_tokens_per_image=MM_TOKENS, boi_token_index=IDS["<start_of_image>"],
        eoi_token_index=IDS["<end_of_image>"], image_token_index=IDS["<image_soft_token>"],
        tie_word_embeddings=True,
    )
    model = common.randomize(Gemma3ForConditionalGeneration(config))
    tok = common.hf_tokenizer(
        SPECIALS, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>",
    )
    image_processor = Gemma3ImageProcessorPil(
        size={"height": 112, "width": 112}, do_pan_and_scan=False, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        resample=2,
    )
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                                image_seq_length=MM_TOKENS)
    images = {k: common.synthetic_image(w, h, kind) for k, (w, h, kind) in IMAGES.items()}
    encoded, client_variants = common.client_formats(images["wide"], "wide")
    common.vlm_fixture(
        "gemma3", "gen_gemma3.py", model, processor, {**images, **encoded},
        common.standard_variants("tall", "wide") + client_variants,
        check=args.check, encoder=encoder, notes=NOTES,
    )


if __name__ == "__main__":
    main()
