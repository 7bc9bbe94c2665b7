"""The `qwen2` tiny decoder stored in bf16 and run in f32, and its goldens: tests/fixtures/qwen2_bf16_f32.

The checkpoint of gen_qwen2_bf16.py (the same draw rounded once to bf16); the reference loads it with
`dtype=torch.float32`, which widens every stored weight exactly and computes in f32: bf16 storage with f32
compute, the parity reference for running a bf16 checkpoint without widening it in memory."""

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
    notes = ["bf16 storage, f32 compute: the reference widens the bf16 weights to f32 at load"]
    common.text_decoder_fixture("qwen2_bf16_f32", "gen_qwen2_bf16_f32.py", Qwen2ForCausalLM, config, tok, args.check,
                                notes=notes, dtype=torch.bfloat16, run_dtype=torch.float32)


if __name__ == "__main__":
    main()
