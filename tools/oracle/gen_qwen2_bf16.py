"""The `qwen2` tiny decoder stored and run in bf16, and its goldens: tests/fixtures/qwen2_bf16.

Same architecture, seed and tokenizer as gen_qwen2.py; the f32 draw is rounded once to bf16 before saving, and
the reference runs in bf16 on CPU (matmuls accumulate in f32, norms and softmax in f32, as torch does)."""

import common
import torch
from transformers import Qwen2ForCausalLM

import gen_qwen2


def main() -> None:
    args = common.parse_args(__doc__)
    config = gen_qwen2.config()
    config.dtype = "bfloat16"
    tok = common.hf_tokenizer(gen_qwen2.SPECIALS, gen_qwen2.CHAT_TEMPLATE, eos_token="<|im_end|>",
                              pad_token="<|endoftext|>")
    common.text_decoder_fixture("qwen2_bf16", "gen_qwen2_bf16.py", Qwen2ForCausalLM, config, tok, args.check,
                                dtype=torch.bfloat16)


if __name__ == "__main__":
    main()
