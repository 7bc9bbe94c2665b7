"""The bf16 form of the served fixtures: tests/fixtures/<name>_bf16 for the text decoders qwen3 and gemma3_text
(qwen2's is tests/fixtures/qwen2_bf16_f32), the vision-language qwen2_vl, qwen2_5_vl, qwen3_vl, gemma3, llava and
molmo2, and Gemma 3n's audio path (gemma3n). llama has none: rounded to bf16, its weights put two tokens within 1.4e-5 of each other on the standard
prompts, under the greedy-margin guard (common.MIN_GREEDY_MARGIN), so its greedy tokens would not be a robust
golden.

llava also gets an f16 form, tests/fixtures/llava_f16, made the same way with float16 (LLaVA-1.5's checkpoints on
the Hub are float16): f16 storage, f32 compute.

Hub checkpoints store their weights in bf16. Each of these is its fixture's checkpoint with every float tensor
rounded once to bf16 and stored so (the config says `dtype: bfloat16`), with the same processor, tokenizer, chat
template and images (Gemma 3n: audio clips). The reference loads it with `dtype=torch.float32`, which widens every stored weight exactly
and computes in f32: bf16 storage with f32 compute, the parity reference for running a bf16 checkpoint's encoder
and decoder without widening its weights in memory. Every golden is recomputed so, stage by stage, for the
fixture's four standard variants (a text decoder's two prompts; Gemma 3n's four audio variants, `audio`,
`two_audios`, `text_only` and `long`, with its per-layer inputs stage).

A family's own post-save step runs on the bf16 checkpoint too: Molmo2's (gen_molmo2.fix_embedding_split) puts the
embedding back into the Hub's split, `wte.embedding` [vocab_size, hidden] + `wte.new_embedding`
[additional_vocab_size, hidden], which transformers 5.24's save_pretrained writes as two halves of the fused
table.

gemma3_text's bf16 checkpoint also gets a bf16-compute form, tests/fixtures/gemma3_text_bf16_compute: the same
weights with `query_pre_attn_scalar` 24 (the fixture's 16 scales attention scores by 1/4, a power of two, which
no rounding of the scale can move; real head sizes such as 128 give scales that are not), its reference run with
`dtype=torch.bfloat16` (bf16 activations; torch's matmuls sum in f32), the reference of `--compute bf16`.
(qwen2's is tests/fixtures/qwen2_bf16, from gen_qwen2_bf16.py.) qwen3 has none: in bf16 two of its long prompt's
greedy candidates tie (margin 0), under the greedy-margin guard.

qwen2_vl's bf16 checkpoint gets one too, tests/fixtures/qwen2_vl_bf16_compute, the reference of its encoder and
decoder under `--compute bf16`: its weights unchanged, its reference run in bf16. Two of its variants have a step
whose two best logits tie in bf16 (two_images at step 13, long at step 6): their goldens keep the greedy tokens
before that step (common.reference_goldens' cut_at_tie) and every prompt logit.

`python gen_bf16.py [--check] [NAME ...]` makes (or checks) only the named forms (`gemma3n_bf16`, `llava_f16`, ...);
regen.sh runs them all."""

import argparse
import json
import shutil
import wave

import numpy as np

import common
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

import gen_gemma3
import gen_gemma3n
import gen_llava
import gen_molmo2
import gen_qwen2_5_vl
import gen_qwen2_vl
import gen_qwen3_vl

TEXT = ["qwen3", "gemma3_text"]
# The text decoders' bf16-compute forms (see the module doc).
TEXT_BF16_COMPUTE = {"gemma3_text": {"query_pre_attn_scalar": 24}}
# What each family's generator passes to common.vlm_fixture besides the model, processor and images.
FAMILIES = {
    "qwen2_vl": dict(encoder=gen_qwen2_vl.encoder, position_rows=3, extra=gen_qwen2_vl.record_rope_delta),
    "qwen2_5_vl": dict(encoder=gen_qwen2_5_vl.encoder, position_rows=3, extra=gen_qwen2_vl.record_rope_delta),
    "qwen3_vl": dict(encoder=gen_qwen3_vl.encoder, position_rows=3, extra=gen_qwen2_vl.record_rope_delta),
    "gemma3": dict(encoder=gen_gemma3.encoder, notes=list(gen_gemma3.NOTES)),
    "llava": dict(encoder=gen_llava.encoder),
    "molmo2": dict(encoder=gen_molmo2.encoder, notes=list(gen_molmo2.NOTES),
                   post_save=gen_molmo2.fix_embedding_split),
    "gemma3n": dict(encoder=gen_gemma3n.encoder, extra=gen_gemma3n.per_layer_inputs, notes=list(gen_gemma3n.NOTES)),
}
# The narrow forms each vision-language fixture gets, by torch dtype and config name.
FORMS = {"qwen2_vl": ["bfloat16"], "qwen2_5_vl": ["bfloat16"], "qwen3_vl": ["bfloat16"], "gemma3": ["bfloat16"],
         "llava": ["bfloat16", "float16"], "molmo2": ["bfloat16"], "gemma3n": ["bfloat16"]}
SHORT = {"bfloat16": "bf16", "float16": "f16"}
# The vision-language families whose bf16 checkpoint also gets a bf16-compute form (see the module doc).
VLM_BF16_COMPUTE = ["qwen2_vl", "qwen2_5_vl"]


# A text decoder's bf16 forms: (name suffix, the reference run's dtype, what the form is); the second for
# TEXT_BF16_COMPUTE only.
TEXT_FORMS = [
    ("_bf16", torch.float32, "bf16 storage, f32 compute: the fixture's weights rounded once to bf16 and stored so; "
                             "the reference widens them to f32 at load (dtype=torch.float32)"),
    ("_bf16_compute", torch.bfloat16, "bf16 storage, bf16 compute: the fixture's weights rounded once to bf16 and "
                                      "stored so; the reference runs in bf16 (dtype=torch.bfloat16)"),
]


def note(dtype: str) -> str:
    return (f"{SHORT[dtype]} storage, f32 compute: the fixture's weights rounded once to {SHORT[dtype]} and stored so; "
            "the reference widens them to f32 at load (dtype=torch.float32)")


# The processor and tokenizer files, copied from the fixture byte for byte (saving a reloaded processor adds the
# loader's own arguments to them).
SAME_FILES = ["tokenizer.json", "tokenizer_config.json", "processor_config.json", "chat_template.jinja"]


def same_files(base, then=None):
    """The post-save step: the family's own (`then`, on the written checkpoint), then the fixture's files."""
    def copy(out):
        if then is not None:
            then(out)
        for name in SAME_FILES:
            if (base / name).is_file():
                shutil.copyfile(base / name, out / name)
    return copy


def wav_samples(path) -> np.ndarray:
    """A fixture's clip as the int16 samples its WAV file stores (vlm_fixture writes them back byte for byte)."""
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.int16)


def media_and_variants(name: str, base) -> tuple[dict, list]:
    """The fixture's media, read back from its files, and its prompt variants."""
    if name == "gemma3n":
        return ({stem: wav_samples(base / f"inputs/{stem}.wav") for stem in gen_gemma3n.CLIPS},
                gen_gemma3n.variants())
    return ({stem: common.load_image(base, f"inputs/{stem}.png") for stem in ("tall", "wide")},
            common.standard_variants("tall", "wide"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="recompute goldens from the committed fixture, write nothing")
    ap.add_argument("names", nargs="*", metavar="NAME", help="only these forms (default: all)")
    args = ap.parse_args()
    text_forms = [(n, form) for n in TEXT for form in TEXT_FORMS[:2 if n in TEXT_BF16_COMPUTE else 1]]
    vlm_forms = [(n, d, torch.float32, "") for n in FAMILIES for d in FORMS[n]]
    vlm_forms += [(n, "bfloat16", torch.bfloat16, "_compute") for n in VLM_BF16_COMPUTE]
    known = [f"{n}{form[0]}" for n, form in text_forms] + [f"{n}_{SHORT[d]}{s}" for n, d, _, s in vlm_forms]
    if unknown := [n for n in args.names if n not in known]:
        ap.error(f"no such form: {', '.join(unknown)} (known: {', '.join(known)})")
    wanted = lambda form: not args.names or form in args.names
    common.setup_torch()
    for name, (suffix, run_dtype, what) in text_forms:
        if not wanted(f"{name}{suffix}"):
            continue
        base = common.FIXTURES / name
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model.config.dtype = "bfloat16"
        if run_dtype == torch.bfloat16:
            weights = model.state_dict()
            for key, value in TEXT_BF16_COMPUTE[name].items():
                setattr(model.config, key, value)
            # Rebuilt: the attention layers read the scale when they are built.
            model = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval()
            model.load_state_dict(weights)
        tok = AutoTokenizer.from_pretrained(base)
        for loader_argument in ("is_local", "local_files_only"):
            tok.init_kwargs.pop(loader_argument, None)
        common.text_decoder_fixture(
            f"{name}{suffix}", "gen_bf16.py", None, None, tok, args.check,
            notes=[what, f"made from tests/fixtures/{name}"] + (
                [f"config changed: {json.dumps(TEXT_BF16_COMPUTE[name], sort_keys=True)}"]
                if run_dtype == torch.bfloat16 else []),
            dtype=torch.bfloat16, run_dtype=run_dtype, model=model,
        )
    for name, dtype, run_dtype, suffix in vlm_forms:
        if not wanted(f"{name}_{SHORT[dtype]}{suffix}"):
            continue
        kwargs = FAMILIES[name]
        base = common.FIXTURES / name
        model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32).to(getattr(torch, dtype))
        for config in [model.config] + [getattr(model.config, k) for k in model.config.sub_configs]:
            config.dtype = dtype
        processor, _ = common.load_processor(base)
        media, variants = media_and_variants(name, base)
        what = note(dtype) if run_dtype == torch.float32 else TEXT_FORMS[1][2]
        kwargs = dict(kwargs, notes=kwargs.get("notes", []) + [what, f"made from tests/fixtures/{name}"],
                      post_save=same_files(base, kwargs.get("post_save")))
        common.vlm_fixture(
            f"{name}_{SHORT[dtype]}{suffix}", "gen_bf16.py", model, processor, media, variants, check=args.check,
            run_dtype=run_dtype, cut_at_tie=run_dtype == torch.bfloat16, **kwargs,
        )


if __name__ == "__main__":
    main()
