"""Tiny random-weight `gemma3_text` decoder (Gemma3ForCausalLM) and its goldens: tests/fixtures/gemma3_text.

Sliding (window 8) and global layers with their own RoPE, QK-norm, (1 + w) RMSNorm, sqrt(hidden) embedding
scale, tied embeddings. The window is small so both prompts exceed it."""

import common
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
IDS = common.special_ids(SPECIALS)

# Gemma turn layout; the assistant role is called "model".
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def text_config(**over) -> dict:
    """The tiny gemma3_text config (the Gemma3 VLM reuses it as its text_config)."""
    cfg = dict(
        vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        pad_token_id=IDS["<pad>"], eos_token_id=[IDS["<eos>"], IDS["<end_of_turn>"]], bos_token_id=IDS["<bos>"],
        tie_word_embeddings=True,
    )
    cfg.update(over)
    return cfg


def main() -> None:
    args = common.parse_args(__doc__)
    config = Gemma3TextConfig(**text_config())
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                              unk_token="<unk>")
    common.text_decoder_fixture("gemma3_text", "gen_gemma3_text.py", Gemma3ForCausalLM, config, tok, args.check)


if __name__ == "__main__":
    main()
