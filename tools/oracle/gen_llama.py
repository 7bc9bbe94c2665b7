"""Tiny random-weight `llama` text decoder (LlamaForCausalLM, Llama 3 style) and its goldens: tests/fixtures/llama."""

import common
from transformers import LlamaConfig, LlamaForCausalLM

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
IDS = common.special_ids(SPECIALS)

# Llama 3 chat layout: headers around the role, content trimmed, <|eot_id|> after each turn.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def main() -> None:
    args = common.parse_args(__doc__)
    config = LlamaConfig(
        vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
        # Llama 3.x frequency-dependent RoPE scaling; original_max_position_embeddings is small so that the
        # tiny head's frequencies fall in all three bands (kept, interpolated, divided by factor).
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        bos_token_id=IDS["<|begin_of_text|>"], eos_token_id=IDS["<|eot_id|>"], tie_word_embeddings=False,
    )
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    common.text_decoder_fixture("llama", "gen_llama.py", LlamaForCausalLM, config, tok, args.check)


if __name__ == "__main__":
    main()
