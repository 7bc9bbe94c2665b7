"""Tiny random-weight Molmo2 (Molmo2ForConditionalGeneration) and its goldens: tests/fixtures/molmo2.

SigLIP-style ViT over a low-resolution global crop plus overlapping high-resolution crops, features of the
last two ViT layers concatenated, an attention-pooling adapter over 2x2 patches (image_token_pooling), a
SwiGLU projector, and a qwen3-style decoder whose embedding is the base vocabulary plus an "additional"
vocabulary holding the image tokens. The whole image block attends bidirectionally (mm_token_type_ids).

Stages: pixel_values [crops, patches, 588], image_token_pooling, image_grids, image_num_crops,
mm_token_type_ids, vision_hidden (last ViT layer per crop), image_features (adapter output, the rows placed
at <im_patch>), inputs_embeds, position_ids, attention mask (with the bidirectional image block), logits,
16 cached greedy tokens. The image processor exists only with the torchvision backend. Besides the standard
variants, the wide picture as a client would send it (common.client_formats): a JPEG, a lossy WebP and an
EXIF-rotated JPEG."""

import common
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    Molmo2Config,
    Molmo2ForConditionalGeneration,
    Molmo2ImageProcessor,
    Molmo2Processor,
    Molmo2VideoProcessor,
)

# Chat tokens belong to the base vocabulary (as in Qwen's tokenizer); the image tokens form the "additional"
# vocabulary that follows it.
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IMAGE_SPECIALS = ["<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<low_res_im_start>", "<|image|>", "<im_low>",
                  "<frame_start>", "<frame_end>", "<|video|>"]
SPECIALS = CHAT_SPECIALS + IMAGE_SPECIALS
IDS = common.special_ids(SPECIALS)
VOCAB = common.BASE_VOCAB + len(CHAT_SPECIALS)
ADDITIONAL_VOCAB = 32

CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{%- if c['type'] == 'image' %}<|image|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{%- endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGES = {"wide": (100, 60, 0), "tall": (50, 90, 1)}
NOTES = [
    "transformers 5.24 save_pretrained writes the fused embedding back as two equal halves "
    "(wte.embedding / wte.new_embedding); the script re-splits it at vocab_size into the original "
    "[vocab_size, hidden] + [additional_vocab_size, hidden] layout, which transformers reloads identically",
    "the processor prepends the eos token as bos when the prompt does not start with it",
]


# Two images with text between them: Molmo2 gives every image token one block id, so each image's tokens
# also attend to the later image's across the text, which stays causal.
APART = common.Variant("images_apart", "two images (wide, tall) with text between them",
                       ["The first picture:", ("image", "wide"), " The second picture:", ("image", "tall"),
                        common.TWO_IMAGE_PROMPT])


def fix_embedding_split(ckpt) -> None:
    path = ckpt / "model.safetensors"
    weights = load_file(path)
    base, extra = "model.transformer.wte.embedding", "model.transformer.wte.new_embedding"
    full = torch.cat([weights[base], weights[extra]])
    weights[base], weights[extra] = full[:VOCAB].clone(), full[VOCAB:].clone()
    save_file(dict(sorted(weights.items())), path, metadata={"format": "pt"})


def encoder(model, inputs):
    out = model.model.get_image_features(
        inputs["pixel_values"], inputs["image_token_pooling"], inputs["image_grids"], output_hidden_states=True
    )
    return {"vision_hidden": out.last_hidden_state, "image_features": torch.cat(out.pooler_output)}


def main() -> None:
    args = common.parse_args(__doc__)
    build("molmo2", "gen_molmo2.py", {}, check=args.check, extra_variants=True)


def build(name: str, script: str, text_overrides: dict, *, check: bool, extra_variants: bool) -> None:
    """The fixture `name`: this tiny Molmo2 with `text_overrides` in its text config."""
    common.setup_torch()
    text = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                vocab_size=VOCAB, additional_vocab_size=ADDITIONAL_VOCAB, num_hidden_layers=2,
                intermediate_size=128, max_position_embeddings=512, qk_norm_type="qwen3",
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                bos_token_id=IDS["<|endoftext|>"], eos_token_id=IDS["<|endoftext|>"],
                pad_token_id=IDS["<|endoftext|>"])
    config = Molmo2Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16, image_size=[56, 56], patch_size=14),
        adapter_config=dict(vision_feature_layer=[-1, -2], hidden_size=32, num_attention_heads=2,
                            num_key_value_heads=2, head_dim=16, intermediate_size=64, text_hidden_size=64),
        text_config={**text, **text_overrides},
        image_start_token_id=IDS["<im_start>"], low_res_image_start_token_id=IDS["<low_res_im_start>"],
        image_end_token_id=IDS["<im_end>"], image_patch_id=IDS["<im_patch>"], image_col_id=IDS["<im_col>"],
        frame_start_token_id=IDS["<frame_start>"], frame_end_token_id=IDS["<frame_end>"],
        tie_word_embeddings=False,
    )
    model = common.randomize(Molmo2ForConditionalGeneration(config))
    tok = common.hf_tokenizer(SPECIALS, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                              image_token="<|image|>", video_token="<|video|>")
    image_processor = Molmo2ImageProcessor(size={"height": 56, "width": 56}, max_crops=2, overlap_margins=[1, 1],
                                           patch_size=14, pooling_size=[2, 2])
    video = Molmo2VideoProcessor(size={"height": 56, "width": 56}, patch_size=14, pooling_size=[2, 2])
    processor = Molmo2Processor(image_processor=image_processor, video_processor=video, tokenizer=tok,
                                chat_template=CHAT_TEMPLATE)
    images = {k: common.synthetic_image(w, h, kind) for k, (w, h, kind) in IMAGES.items()}
    encoded, client_variants = common.client_formats(images["wide"], "wide")
    variants = common.standard_variants("tall", "wide")
    if extra_variants:
        variants += client_variants + [APART]
    common.vlm_fixture(
        name, script, model, processor, {**images, **encoded} if extra_variants else images, variants,
        check=check, encoder=encoder, post_save=fix_embedding_split, notes=NOTES,
    )


if __name__ == "__main__":
    main()
