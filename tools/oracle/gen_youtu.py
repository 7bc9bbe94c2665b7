"""Tiny random-weight `youtu` text decoder (YoutuForCausalLM, Youtu-LLM: multi-head latent attention with
a low-rank query projection, the shared rotary key, interleaved rotary pairs, tied embeddings):
tests/fixtures/youtu. The transformers reference for the decoder Youtu-VL's language model shares."""

import common
from transformers import YoutuConfig, YoutuForCausalLM

# Qwen-style ChatML specials and template, as the Youtu-VL fixture's.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IDS = common.special_ids(SPECIALS)
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def main() -> None:
    args = common.parse_args(__doc__)
    config = YoutuConfig(
        vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, v_head_dim=16,
        qk_nope_head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rope_interleave=True,
        bos_token_id=IDS["<|endoftext|>"], eos_token_id=IDS["<|im_end|>"], pad_token_id=IDS["<|endoftext|>"],
        tie_word_embeddings=True,
    )
    tok = common.hf_tokenizer(SPECIALS, CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    model = common.randomize(YoutuForCausalLM(config))
    # transformers zeroes the padding row of a tied Youtu table when it loads one: draw it as zeros, so the
    # reloaded model is the one saved.
    with common.torch.no_grad():
        model.model.embed_tokens.weight[IDS["<|endoftext|>"]] = 0.0
    common.text_decoder_fixture("youtu", "gen_youtu.py", YoutuForCausalLM, config, tok, args.check, model=model,
                                notes=["the padding token's embedding row is zero: transformers zeroes it on load"])


if __name__ == "__main__":
    main()
