"""Tiny random-weight `qwen2` text decoder (Qwen2ForCausalLM) and its goldens: tests/fixtures/qwen2."""

import common
from transformers import Qwen2Config, Qwen2ForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IDS = common.special_ids(SPECIALS)

# ChatML (without Qwen2's default system turn, to keep the short prompt inside one prefill chunk).
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=IDS["<|endoftext|>"], eos_token_id=IDS["<|im_end|>"], pad_token_id=IDS["<|endoftext|>"],
        tie_word_embeddings=False,
    )


def main() -> None:
    args = common.parse_args(__doc__)
    config_ = config()
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    common.text_decoder_fixture("qwen2", "gen_qwen2.py", Qwen2ForCausalLM, config_, tok, args.check)


if __name__ == "__main__":
    main()
