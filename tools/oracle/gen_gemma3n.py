"""Tiny random-weight Gemma3n, audio path (Gemma3nForConditionalGeneration): tests/fixtures/gemma3n.

Log-mel features (Gemma3nAudioFeatureExtractor) -> USM-style conformer (SSCP conv subsampling, chunked local
attention, light conv, reduction by 4) -> embed_audio (soft-token projection) placed at <audio_soft_token>,
padded to audio_soft_tokens_per_image with the embedding of id vocab_size - 1. The decoder has AltUp,
LAuReL, per-layer inputs, KV-shared layers (2 and 3 reuse the caches of 0 and 1), activation sparsity in
layer 0, sliding and full layers, and final logit soft-capping.

Token layout mirrors the real model's 262144 / 262272 split: text ids, then an 8-id vision vocabulary, then
an 8-id audio vocabulary (last, since audio padding uses id vocab_size - 1).

The vision tower is a tiny timm test model standing in for MobileNetV5 (which cannot be shrunk); only the
audio path is recorded.

Stages: input_features, input_features_mask, audio_hidden (conformer output), audio_mel_mask,
audio_features (the rows placed at the soft tokens: embed_audio's output, masked frames and the rows past the
clip's as the padding embedding), per_layer_inputs (token-indexed per-layer embeddings, before the
projection), inputs_embeds, position_ids, attention masks (sliding and full), logits, 16 greedy tokens."""

import common
from transformers import (
    Gemma3nAudioFeatureExtractor,
    Gemma3nConfig,
    Gemma3nForConditionalGeneration,
    Gemma3nProcessor,
    SiglipImageProcessorPil,
)

TEXT_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                 "<start_of_audio>"]
VISION_SPECIALS = ["<end_of_image>", "<image_soft_token>"] + [f"<vision_unused_{i}>" for i in range(6)]
AUDIO_SPECIALS = ["<end_of_audio>", "<audio_soft_token>"] + [f"<audio_unused_{i}>" for i in range(6)]
SPECIALS = TEXT_SPECIALS + VISION_SPECIALS + AUDIO_SPECIALS
IDS = common.special_ids(SPECIALS)
V_TEXT = IDS["<end_of_image>"]
V_AUDIO = IDS["<end_of_audio>"]
AUDIO_TOKENS, IMAGE_TOKENS = 8, 4

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}{% for c in m['content'] %}"
    "{%- if c['type'] == 'audio' %}<audio_soft_token>{% elif c['type'] == 'image' %}<image_soft_token>"
    "{%- elif c['type'] == 'text' %}{{ c['text'] | trim }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CLIPS = {"chirp": (1.0, 200.0, 2000.0), "short_chirp": (0.6, 800.0, 300.0)}
# The fixture's provenance notes, for the forms made from it (gen_bf16.py); main() writes the same two.
NOTES = ["audio path only: the vision tower is a timm test_convnext stand-in for MobileNetV5",
         "audio clips are 16-bit mono WAV; the feature extractor receives samples / 32768"]


def variants() -> list[common.Variant]:
    return [
        common.Variant("audio", "one 1 s clip", [("audio", "chirp"), "Transcribe this audio."]),
        common.Variant("two_audios", "two clips of different lengths (1 s, 0.6 s) in one prompt",
                       [("audio", "chirp"), ("audio", "short_chirp"), "Compare the two clips."]),
        # Not the shared TEXT_PROMPT: with it one greedy step has a top-1/top-2 gap of only 2e-4.
        common.Variant("text_only", "a text-only prompt to the multimodal checkpoint", ["Say hello, please."]),
        common.Variant("long", f"text, a clip, more text: longer than one prefill chunk of {common.PREFILL_CHUNK}",
                       [common.LONG_HEAD, ("audio", "chirp"), common.LONG_TAIL]),
    ]


def encoder(model, inputs):
    """The conformer's output and mask, and the rows placed at each clip's soft tokens, as
    Gemma3nModel.forward places them: masked frames and the rows past the clip's take the
    embedding of id vocab_size - 1."""
    import torch

    out = model.model.get_audio_features(inputs["input_features"], ~inputs["input_features_mask"])
    features, mask = out.pooler_output, out.audio_mel_mask
    pad = model.model.embed_audio(input_ids=torch.tensor([[model.model.vocab_size - 1]]))
    placed = torch.where(mask.unsqueeze(-1), pad, features)
    extra = pad.expand(placed.shape[0], AUDIO_TOKENS - placed.shape[1], placed.shape[2])
    return {"audio_hidden": out.last_hidden_state, "audio_mel_mask": mask,
            "audio_features": torch.cat((placed, extra), dim=1)}


def per_layer_inputs(model, inputs, g) -> None:
    g.put("per_layer_inputs", model.model.language_model.get_per_layer_inputs(inputs["input_ids"])[0])


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    config = Gemma3nConfig(
        text_config=dict(
            vocab_size=V_AUDIO + 8, vocab_size_per_layer_input=V_TEXT, hidden_size=64, intermediate_size=128,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            hidden_size_per_layer_input=8, altup_num_inputs=2, altup_active_idx=0, laurel_rank=8,
            num_kv_shared_layers=2, sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0], final_logit_softcapping=30.0,
            max_position_embeddings=512,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            pad_token_id=IDS["<pad>"], eos_token_id=[IDS["<eos>"], IDS["<end_of_turn>"]], bos_token_id=IDS["<bos>"],
        ),
        audio_config=dict(
            vocab_size=8, vocab_offset=V_AUDIO, input_feat_size=32, hidden_size=32, conf_num_attention_heads=2,
            conf_num_hidden_layers=2, conf_attention_chunk_size=4, conf_attention_context_left=5,
            conf_attention_context_right=0, conf_attention_logit_cap=50.0, conf_conv_kernel_size=5,
            conf_reduction_factor=4, conf_residual_weight=0.5, sscp_conv_channel_size=[8, 4],
        ),
        vision_config=dict(architecture="test_convnext", hidden_size=64, vocab_size=8, vocab_offset=V_TEXT,
                           do_pooling=False),
        audio_soft_tokens_per_image=AUDIO_TOKENS, vision_soft_tokens_per_image=IMAGE_TOKENS,
        boi_token_id=IDS["<start_of_image>"], eoi_token_id=IDS["<end_of_image>"],
        image_token_id=IDS["<image_soft_token>"], boa_token_id=IDS["<start_of_audio>"],
        eoa_token_id=IDS["<end_of_audio>"], audio_token_id=IDS["<audio_soft_token>"], tie_word_embeddings=True,
    )
    model = common.randomize(Gemma3nForConditionalGeneration(config))
    tok = common.hf_tokenizer(
        SPECIALS, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>",
        boa_token="<start_of_audio>", eoa_token="<end_of_audio>", audio_token="<audio_soft_token>",
    )
    processor = Gemma3nProcessor(
        feature_extractor=Gemma3nAudioFeatureExtractor(feature_size=32, sampling_rate=common.AUDIO_RATE),
        image_processor=SiglipImageProcessorPil(size={"height": 64, "width": 64}), tokenizer=tok,
        chat_template=CHAT_TEMPLATE, audio_seq_length=AUDIO_TOKENS, image_seq_length=IMAGE_TOKENS,
    )
    clips = {k: common.synthetic_audio(*spec) for k, spec in CLIPS.items()}
    common.vlm_fixture(
        "gemma3n", "gen_gemma3n.py", model, processor, clips, variants(), check=args.check, encoder=encoder,
        extra=per_layer_inputs,
        notes=["audio path only: the vision tower is a timm test_convnext stand-in for MobileNetV5",
               "audio clips are 16-bit mono WAV; the feature extractor receives samples / 32768"],
    )


if __name__ == "__main__":
    main()
