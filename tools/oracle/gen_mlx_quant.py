"""MLX affine-quantized forms of the text decoder fixtures, made by MLX's own converter, with MLX as the reference:
tests/fixtures/qwen3_mlx_q4, qwen3_mlx_q8 and llama_mlx_mixed.

Each checkpoint is what `mlx_lm.convert` writes from a committed fixture, as a user gets it from the MLX
community: config.json with its `quantization` block (and the `quantization_config` copy), model.safetensors
(each quantized Linear and Embedding as a U32 `weight` of packed codes beside f32 `scales` and `biases`, one per
group of `group_size` inputs), model.safetensors.index.json, tokenizer.json, tokenizer_config.json,
chat_template.jinja, generation_config.json and the model card README.md (81 bytes of front matter, no paths).

- qwen3_mlx_q4: tests/fixtures/qwen3, 4 bits, group 64 (the MLX community default); tied head.
- qwen3_mlx_q8: tests/fixtures/qwen3, 8 bits, group 32.
- llama_mlx_mixed: tests/fixtures/llama_hub (llama's weights in the legacy config form, see LLAMA_BASE), 4 bits
  group 32 by default, with per-module choices from mlx_lm's own `quant_predicate` mechanism: lm_head 8 bits
  group 64, model.layers.0.mlp.down_proj 8 bits group 128, model.layers.1.self_attn.v_proj left dense.

The goldens come from `mlx_lm.load` of the written fixture on mlx-cpu in float32, for the text decoders' `short`
and `long` prompts (rendered and tokenized as common.text_decoder_fixture does): inputs_embeds (the dequantized
embedding rows MLX feeds the first layer), position_ids, full-prompt logits from one forward, and 16 greedy
tokens decoded through MLX's KV cache with each step's logits. `mlx_lm.stream_generate` with a greedy sampler
(temp 0) on the same prompt ids is the acceptance reference: it must pick the same 16 tokens, as must full
recomputation. No attention_mask stages: MLX applies the causal mask implicitly (mask mode "causal").

Each run also checks that mlx_lm on the unquantized base reproduces the base fixture's transformers logits
(so MLX reads the config as transformers does), and records in the provenance notes how far `mx.dequantize` of
each quantized weight is from the base's f32 weight and whether unpacking the codes by hand in numpy
reproduces `mx.dequantize` bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import common
import mlx.core as mx
import numpy as np
import torch
from safetensors.numpy import load_file

MODE = "affine"
# mlx-lm 0.32.2's llama reads `rope_theta` and `rope_scaling` only and silently ignores transformers 5's
# `rope_parameters`, so converted from tests/fixtures/llama it would run plain RoPE at theta 10000 while its
# config says llama3 (logits off by 3 to 4 from transformers). tests/fixtures/llama_hub holds llama's weights
# byte for byte in the legacy config form, which Hub and MLX community Llama 3 checkpoints carry.
LLAMA_BASE = "llama_hub"
# The per-module choices of llama_mlx_mixed, as an mlx_lm quant_predicate returns them: a dict is recorded in
# config.json's `quantization` under the module's path, False leaves the module dense (and is not recorded:
# the loader finds no `scales` for it), True takes the default bits and group.
MIXED = {
    "lm_head": {"group_size": 64, "bits": 8, "mode": MODE},
    "model.layers.0.mlp.down_proj": {"group_size": 128, "bits": 8, "mode": MODE},
    "model.layers.1.self_attn.v_proj": False,
}


def mixed_predicate(path: str, module) -> bool | dict:
    return MIXED.get(path, True)


# name -> (base fixture, golden base for the prompts' ids, bits, group size, predicate or None)
FIXTURES = {
    "qwen3_mlx_q4": ("qwen3", "qwen3", 4, 64, None),
    "qwen3_mlx_q8": ("qwen3", "qwen3", 8, 32, None),
    "llama_mlx_mixed": (LLAMA_BASE, "llama", 4, 32, mixed_predicate),
}
# mlx_lm on the unquantized base must reproduce the base's transformers logits this closely.
BASE_LOGITS_ATOL = 1e-5


def mlx_version(name: str) -> str:
    import importlib.metadata as md

    return md.version(name)


def convert(base: Path, out: Path, bits: int, group: int, predicate) -> None:
    from mlx_lm import convert as mlx_convert

    out.rmdir()  # mlx_lm.convert refuses an existing directory
    mlx_convert(str(base), mlx_path=str(out), quantize=True, q_group_size=group, q_bits=bits, dtype="float32",
                quant_predicate=predicate)


def convert_call(base: str, name: str, bits: int, group: int, predicate) -> str:
    args = f"quantize=True, q_group_size={group}, q_bits={bits}, dtype='float32'"
    if predicate is not None:
        args += ", quant_predicate=mixed_predicate"
    return f"mlx_lm.convert('tests/fixtures/{base}', mlx_path='tests/fixtures/{name}', {args})"


def module_params(quant: dict, path: str) -> dict:
    own = quant.get(path)
    return own if isinstance(own, dict) else {"group_size": quant["group_size"], "bits": quant["bits"], "mode": MODE}


def unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packing for 2, 4 and 8 bits: each u32 word holds 32/bits codes, the first in the least
    significant bits."""
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
    codes = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return codes.reshape(words.shape[0], words.shape[1] * per)


def dequantize_cross_check(fixture: Path, base: Path) -> tuple[list[str], dict[str, dict]]:
    """mx.dequantize against the base's f32 weights and against a numpy dequantization by hand.

    Returns (provenance notes, per-module quantization layout)."""
    quant = json.loads((fixture / "config.json").read_text())["quantization"]
    q = mx.load(str(fixture / "model.safetensors"))
    orig = load_file(str(base / "model.safetensors"))
    layout: dict[str, dict] = {}
    worst = (0.0, "-")
    worst_in_scales = (0.0, "-")
    hand_diff, hand_fma_diff = 0.0, 0.0
    groups = bias_is_edge = negative = zero_on_code = 0
    for key in sorted(k for k in q if k.endswith(".scales")):
        path = key.removesuffix(".scales")
        p = module_params(quant, path)
        w, s, b = q[f"{path}.weight"], q[f"{path}.scales"], q[f"{path}.biases"]
        assert w.dtype == mx.uint32 and s.dtype == mx.float32 and b.dtype == mx.float32, path
        deq = np.array(mx.dequantize(w, s, b, group_size=p["group_size"], bits=p["bits"], mode=MODE))
        ref = orig[f"{path}.weight"]
        assert deq.shape == ref.shape and w.shape[-1] * 32 // p["bits"] == ref.shape[-1], path
        assert s.shape[-1] * p["group_size"] == ref.shape[-1], path
        layout[path] = p
        # MLX's affine convention: the bias is the group's extreme of larger magnitude, stored exactly (code 0);
        # the scale is signed and adjusted so that 0.0 falls on a code.
        sg, bg = np.array(s), np.array(b)
        grouped = ref.reshape(ref.shape[0], -1, p["group_size"])
        lo, hi = grouped.min(-1), grouped.max(-1)
        groups += bg.size
        bias_is_edge += int((bg == np.where(np.abs(lo) > np.abs(hi), lo, hi)).sum())
        negative += int((sg < 0).sum())
        zero_code = -bg.astype(np.float64) / sg
        zero_on_code += int((np.abs(zero_code - np.round(zero_code)) < 1e-3).sum())
        scales = np.repeat(sg, p["group_size"], axis=-1)
        biases = np.repeat(bg, p["group_size"], axis=-1)
        err = np.abs(deq - ref)
        if err.max() > worst[0]:
            worst = (float(err.max()), path)
        ratio = float((err / np.abs(scales)).max())
        if ratio > worst_in_scales[0]:
            worst_in_scales = (ratio, path)
        codes = unpack(np.array(w), p["bits"]).astype(np.float32)
        assert codes.max() < 2 ** p["bits"]
        hand = codes * scales + biases  # f32: a rounded product, then a rounded sum
        hand_fma = (codes.astype(np.float64) * scales + biases).astype(np.float32)  # one rounding (fma)
        hand_diff = max(hand_diff, float(np.abs(hand - deq).max()))
        hand_fma_diff = max(hand_fma_diff, float(np.abs(hand_fma - deq).max()))
    # What stayed dense is the base's weight exactly (f32 to f32).
    for key in sorted(k for k in q if not k.endswith((".scales", ".biases"))):
        path = key.removesuffix(".weight")
        if f"{path}.scales" in q:
            continue
        assert q[key].dtype == mx.float32 and np.array_equal(np.array(q[key]), orig[key]), key
    if hand_diff == 0.0:
        hand_note = "bit-identical to mx.dequantize"
    else:
        hand_note = (f"not bit-identical to mx.dequantize (max diff {hand_diff:.3g}); with a single rounding "
                     f"(fma) the max diff is {hand_fma_diff:.3g}")
    notes = [
        f"dequantize cross-check over {len(layout)} quantized modules: max |mx.dequantize - base f32 weight| = "
        f"{worst[0]:.4g} (at {worst[1]}); the largest error in units of its group's scale is "
        f"{worst_in_scales[0]:.4g} (at {worst_in_scales[1]}): about one scale, not half, because of MLX's affine "
        f"convention, seen in {bias_is_edge} of {groups} groups: the bias is the group's extreme of larger magnitude, "
        f"stored exactly as code 0, and the scale is signed ({negative} of {groups} negative) and adjusted so that "
        f"0.0 falls on a code ({zero_on_code} of {groups}), so the group's other end can clip",
        "numpy by hand (u32 words unpacked least significant bits first, w = q * scale + bias in f32): "
        + hand_note,
    ]
    return notes, layout


def check_base_reading(base: Path, golden_base: Path) -> None:
    """mlx_lm on the unquantized base reproduces the base fixture's transformers goldens (so MLX reads the config
    the way transformers does)."""
    from mlx_lm import load

    model, _ = load(str(base))
    for variant in ("short", "long"):
        g = load_file(str(golden_base / "goldens" / f"{variant}.safetensors"))
        logits = np.array(model(mx.array(g["input_ids"][None].astype(np.int32)))[0])
        diff = float(np.abs(logits - g["logits"]).max())
        if diff > BASE_LOGITS_ATOL:
            raise RuntimeError(f"mlx_lm on {base.name} is {diff:.3g} from its transformers logits ({variant}): "
                               "MLX reads this config differently")


def goldens(model, tok, text: str, expect_ids: list[int]) -> common.Golden:
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    messages = [{"role": "user", "content": text}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    id_list = tok.encode(prompt, add_special_tokens=False)
    if id_list != expect_ids:
        raise RuntimeError(f"prompt ids {id_list} differ from the base fixture's {expect_ids}")
    ids = mx.array([id_list])
    n = len(id_list)

    g = common.Golden()
    g.put("input_ids", torch.tensor(id_list))
    g.put("inputs_embeds", torch.from_numpy(np.array(model.model.embed_tokens(ids)[0])))
    g.put("position_ids", torch.arange(n))
    g.put("logits", torch.from_numpy(np.array(model(ids)[0])))

    cache = make_prompt_cache(model)
    step = model(ids, cache=cache)[0, -1]
    tokens, steps = [], []
    for _ in range(common.GREEDY_TOKENS):
        mx.eval(step)
        steps.append(np.array(step))
        tokens.append(int(np.argmax(steps[-1])))
        step = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]

    # MLX's own generation, the acceptance reference: greedy sampler, no EOS stop (as common.greedy).
    eos = tok.eos_token_ids
    tok.eos_token_ids = set()
    try:
        ref = [r.token for r in stream_generate(model, tok, mx.array(id_list), max_tokens=common.GREEDY_TOKENS,
                                                sampler=make_sampler(temp=0.0))]
    finally:
        tok.eos_token_ids = eos
    if ref != tokens:
        raise RuntimeError(f"cached greedy {tokens} != mlx_lm.stream_generate {ref}")
    cur = list(id_list)
    for t in tokens:
        nxt = int(np.argmax(np.array(model(mx.array([cur]))[0, -1])))
        if nxt != t:
            raise RuntimeError(f"cached greedy {tokens} diverges from full recompute at {t} vs {nxt}")
        cur.append(t)

    step_logits = torch.from_numpy(np.stack(steps))
    top2 = step_logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    if float(margins.min()) < common.MIN_GREEDY_MARGIN:
        raise RuntimeError(f"greedy margin {float(margins.min()):.2e} < {common.MIN_GREEDY_MARGIN}: "
                           "pick another quantization")
    g.put("greedy_tokens", torch.tensor(tokens))
    g.put("decode_logits", step_logits)
    g.put("greedy_margins", margins)
    g.meta.update(n_prompt_tokens=n, input_ids=id_list, greedy_tokens=tokens, min_greedy_margin=float(margins.min()),
                  prefill_chunks=-(-n // common.PREFILL_CHUNK), messages=messages, prompt=prompt,
                  add_special_tokens=False)
    return g


def summary(layout: dict[str, dict], quant: dict, mixed: bool, tied: bool, bpw: float) -> str:
    overrides = {k: v for k, v in quant.items() if k not in ("group_size", "bits", "mode")}
    dense = sorted(k for k, v in MIXED.items() if v is False) if mixed else []
    for path in dense:
        if path in overrides or path in layout:
            raise RuntimeError(f"{path} should be dense")
    parts = [f"affine, {quant['bits']} bits, group {quant['group_size']} by default; {len(layout)} quantized "
             "modules: every Linear and the embedding" + (" but the dense ones below" if dense else "")]
    for path, p in sorted(overrides.items()):
        parts.append(f"{path}: {p['bits']} bits, group {p['group_size']} (recorded in config.json quantization)")
    for path in dense:
        parts.append(f"{path}: dense f32 (predicate False: not recorded in config.json; no scales or biases)")
    parts.append("weights U32 packed codes (32/bits a word, least significant bits first), scales and biases f32 "
                 "[out, in / group]")
    parts.append("tied head: no lm_head tensor; MLX takes the logits from the quantized embedding "
                 "(embed_tokens.as_linear)" if tied else "untied lm_head, quantized on its own")
    parts.append(f"{bpw:.3f} bits per weight (mlx_lm compute_bits_per_weight)")
    return "quantization: " + "; ".join(parts)


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    from mlx_lm import load
    from mlx_lm.utils import compute_bits_per_weight

    for name, (base_name, golden_name, bits, group, predicate) in FIXTURES.items():
        base, golden_base = common.FIXTURES / base_name, common.FIXTURES / golden_name
        fixture = common.FIXTURES / name
        print(f"{name}:", flush=True)
        check_base_reading(base, golden_base)
        out = common.stage_dir(fixture, args.check)
        convert(base, out, bits, group, predicate)
        if args.check:
            common.compare_checkpoint(out, fixture)

        model, tok, config = load(str(fixture), return_config=True)
        quant = config["quantization"]
        deq_notes, layout = dequantize_cross_check(fixture, base)
        for variant, text in (("short", common.TEXT_PROMPT), ("long", common.LONG_PROMPT)):
            expect = json.loads((golden_base / "goldens" / f"{variant}.json").read_text())["input_ids"]
            g = goldens(model, tok, text, expect)
            if variant == "long":
                assert g.meta["n_prompt_tokens"] > common.PREFILL_CHUNK
            common.write_golden(fixture, variant, g, args.check)

        notes = [f"made from tests/fixtures/{base_name} by " + convert_call(base_name, name, bits, group, predicate)]
        if predicate is not None:
            notes.append("mixed_predicate(path, module) returns " + json.dumps(MIXED) + " by path, else True "
                         "(the default bits and group)")
        if base_name != golden_name:
            notes.append(f"made from {base_name}, not {golden_name}: it holds {golden_name}'s weights byte for byte "
                         "in the legacy config form (rope_theta, rope_scaling); mlx-lm 0.32.2's llama ignores "
                         "transformers 5's rope_parameters and would run plain RoPE at theta 10000 on "
                         f"tests/fixtures/{golden_name}")
        notes += [
            summary(layout, quant, predicate is not None, bool(config.get("tie_word_embeddings")), compute_bits_per_weight(model)),
            *deq_notes,
            f"mlx_lm on the unquantized tests/fixtures/{base_name} reproduces the transformers logits of "
            f"tests/fixtures/{golden_name} within {BASE_LOGITS_ATOL:g} (checked on every run); the prompt ids are "
            "that fixture's",
            "greedy tokens: MLX's cached decode, mlx_lm.stream_generate (make_sampler(temp=0.0), EOS not stopping) "
            "and full recomputation agree on all 16",
            "no attention_mask stages: MLX applies the causal mask implicitly (mask mode 'causal')",
            "README.md is mlx_lm's model card (front matter only, no paths), kept as converted; tokenizer_config.json "
            "is as mlx_lm saves it (transformers adds is_local and local_files_only)",
        ]
        common.write_provenance(
            fixture, "gen_mlx_quant.py",
            f"mlx-lm {mlx_version('mlx-lm')} load + generate on mlx-cpu {mlx_version('mlx-cpu')}, float32, greedy",
            {"short": "one user turn, shorter than one prefill chunk",
             "long": f"one user turn, longer than one prefill chunk of {common.PREFILL_CHUNK} tokens"},
            args.check, extra_versions=("mlx", "mlx-cpu", "mlx-lm"), notes=notes,
        )
        common.finish(fixture)


if __name__ == "__main__":
    main()
