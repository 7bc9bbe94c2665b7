"""Tiny random-weight `qwen3` text decoder (Qwen3ForCausalLM: QK-norm, tied embeddings): tests/fixtures/qwen3."""

import common
from transformers import Qwen3Config, Qwen3ForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
IDS = common.special_ids(SPECIALS)

# ChatML; like Qwen3's template with enable_thinking=False, the generation prompt carries an empty think block.
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
)


def main() -> None:
    args = common.parse_args(__doc__)
    config = Qwen3Config(
        vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=IDS["<|endoftext|>"], eos_token_id=IDS["<|im_end|>"], pad_token_id=IDS["<|endoftext|>"],
        tie_word_embeddings=True,
    )
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    common.text_decoder_fixture("qwen3", "gen_qwen3.py", Qwen3ForCausalLM, config, tok, args.check)


if __name__ == "__main__":
    main()
