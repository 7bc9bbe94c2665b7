"""torch's bf16 linears at real widths, and their goldens: tests/fixtures/torch_linears.

transformers in bf16 computes every `Linear` with torch's bf16 `linear`, which on a CPU with AVX512-BF16 is
oneDNN's gemm: bf16 products summed into f32 two inputs at a time (`vdpbf16ps`, the odd input's product first),
in blocks of 1024 inputs, each block's sum from zero and the blocks' sums added in order, then rounded to bf16.
Models' tiny fixtures sum a few dozen inputs, where any order gives the same bf16 values; a real model's
linears sum 1280 to 8960 (Qwen2-VL-2B's vision blocks and its MLP), where one run over all inputs parts from
torch in about one output of 2000. The numeric contract states torch's blocks for its bf16 pairs
(`PAIRS_BLOCK_INPUTS`), and this fixture holds it to them.

For each shape (rows of `x`, inputs) the script draws bf16 `x` (columns scaled apart, as a residual stream's
are) and 512 candidate weight rows, checks that a numpy emulation of the blocked sum reproduces every output of
torch's `linear`, and keeps 32 weight rows: those where a sum in other blocks (one run over all inputs, blocks
of 512 or 2048) rounds differently, then random ones. The goldens are torch's `linear` of the kept rows."""

import json

import common
import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as st_save

FIXTURE = common.FIXTURES / "torch_linears"
# (rows, inputs): two decode streams and a prompt chunk's rows; one block exactly (1024), a block and a
# quarter (1280: a vision block's width), a block and a half (1536: the text width), five (5120: a vision
# MLP's) and eight and three quarters (8960: the text MLP's).
SHAPES = [(16, 1024), (16, 1280), (16, 1536), (16, 5120), (2, 8960), (8, 8960)]
BLOCK = 1024
CANDIDATES = 512
KEEP = 32


def pair_sums(x: np.ndarray, w: np.ndarray, block: int) -> np.ndarray:
    """f32 sums of x @ w.T: pairs of inputs, the odd one's product first, restarting every `block` inputs,
    the blocks' sums added in order (every addition rounded to f32; a bf16 product is exact in f32)."""
    total = None
    for lo in range(0, x.shape[1], block):
        acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
        for i in range(lo, min(x.shape[1], lo + block), 2):
            acc = (acc + np.outer(x[:, i + 1], w[:, i + 1])).astype(np.float32)
            acc = (acc + np.outer(x[:, i], w[:, i])).astype(np.float32)
        total = acc if total is None else (total + acc).astype(np.float32)
    return total


def as_bf16(v: np.ndarray) -> np.ndarray:
    return torch.from_numpy(v).to(torch.bfloat16).float().numpy()


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    common.stage_dir(FIXTURE, args.check, torch.bfloat16)
    gen = torch.Generator().manual_seed(common.SEED)
    rng = np.random.default_rng(common.SEED)
    tensors = {}
    notes = []
    if args.check:
        # Recompute torch's outputs of the committed operands: which weight rows were kept depends on how
        # torch sums on the CPU that drew them, so another CPU redraws the same rows but may keep others.
        committed = load_file(FIXTURE / "linears.safetensors")
        for rows, inputs in SHAPES:
            x, w = committed[f"x.{rows}x{inputs}"], committed[f"w.{rows}x{inputs}"]
            tensors[f"x.{rows}x{inputs}"], tensors[f"w.{rows}x{inputs}"] = x, w
            tensors[f"y.{rows}x{inputs}"] = torch.nn.functional.linear(x, w)
        notes = json.loads((FIXTURE / "provenance.json").read_text())["notes"][:-1]
    for rows, inputs in [] if args.check else SHAPES:
        scale = torch.exp(torch.randn(1, inputs, generator=gen) * 1.5)
        x = (torch.randn(rows, inputs, generator=gen) * scale).to(torch.bfloat16)
        w = (torch.randn(CANDIDATES, inputs, generator=gen) * 0.02).to(torch.bfloat16)
        y = torch.nn.functional.linear(x, w).float().numpy()
        xf, wf = x.float().numpy(), w.float().numpy()
        ours = as_bf16(pair_sums(xf, wf, BLOCK))
        assert np.array_equal(ours, y), f"{rows}x{inputs}: blocks of {BLOCK} are not torch's order here"
        parted = np.zeros(CANDIDATES, bool)
        for other in (512, 2048, inputs):
            if other != BLOCK:
                parted |= (as_bf16(pair_sums(xf, wf, other)) != y).any(axis=0)
        sensitive = np.flatnonzero(parted)[:KEEP]
        rest = rng.permutation(np.flatnonzero(~parted))[: KEEP - len(sensitive)]
        keep = np.sort(np.concatenate([sensitive, rest]))
        wk = w[torch.from_numpy(keep)]
        tensors[f"x.{rows}x{inputs}"] = x
        tensors[f"w.{rows}x{inputs}"] = wk
        tensors[f"y.{rows}x{inputs}"] = torch.nn.functional.linear(x, wk)
        notes.append(f"{rows}x{inputs}: {len(sensitive)} of {KEEP} kept outputs round differently in other blocks")
    data = st_save(dict(sorted(tensors.items())), metadata={"block_inputs": str(BLOCK)})
    common.emit(FIXTURE / "linears.safetensors", data, args.check)
    common.write_provenance(FIXTURE, "gen_torch_linears.py", "torch: torch.nn.functional.linear in bf16 on CPU",
                            {"linears": "bf16 x and weight rows at real widths; torch's bf16 linear of them"},
                            args.check, notes=notes + ["torch's CPU kernels' own results, in bf16"],
                            dtype="bfloat16")
    common.finish(FIXTURE)


if __name__ == "__main__":
    main()
