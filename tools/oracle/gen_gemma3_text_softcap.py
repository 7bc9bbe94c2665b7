"""Tiny random-weight `gemma3_text` decoder with final-logit soft-capping (Gemma3ForCausalLM applies
`tanh(logits / c) * c`) and its goldens: tests/fixtures/gemma3_text_softcap.

The gemma3_text fixture's config with `final_logit_softcapping` 1.0: the random logits reach about 5, so the
cap bends every one of them (4.2 the largest change on the short prompt). transformers 5.24's Gemma3 attention
reads `attn_logit_softcapping` but never applies it, so that stays unset here."""

import common
import gen_gemma3_text
from transformers import Gemma3ForCausalLM, Gemma3TextConfig


def main() -> None:
    args = common.parse_args(__doc__)
    config = Gemma3TextConfig(**gen_gemma3_text.text_config(final_logit_softcapping=1.0))
    tok = common.hf_tokenizer(gen_gemma3_text.SPECIALS, gen_gemma3_text.CHAT_TEMPLATE, bos_token="<bos>",
                              eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    notes = ["final_logit_softcapping 1.0 (the gemma3_text config otherwise)"]
    common.text_decoder_fixture("gemma3_text_softcap", "gen_gemma3_text_softcap.py", Gemma3ForCausalLM, config, tok,
                                args.check, notes=notes)


if __name__ == "__main__":
    main()
