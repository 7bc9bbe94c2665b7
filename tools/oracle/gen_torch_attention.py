"""torch's bf16 attention products at real widths, and their goldens: tests/fixtures/torch_attention.

transformers' eager attention in bf16 computes a head's scores as `torch.matmul(q, k.transpose(2, 3))` and its
output as `torch.matmul(probs, v)`, both torch's bf16 batched gemm. On a CPU with AVX512-BF16 that is oneDNN's,
which sums as its `linear` does (gen_torch_linears.py): bf16 products into f32 two inputs at a time, the odd
input's first, in blocks of 1024 inputs, the blocks' sums added in order, then rounded to bf16. A score sums
over the head's width (128 in Qwen2-VL-2B), an output over the keys (1600 here: two blocks).

Between them, `softmax(scores, dim=-1, dtype=torch.float32)` then `.to(bf16)`: torch's CPU kernel on AVX-512
(`_vec_softmax_lastdim<float>`) takes the row's maximum, Sleef's `expf` of each input less it, sums the
exponentials in 16 vector lanes (in order within a lane, then lanes halved), and multiplies each by `1 / sum`.
The fixture holds bf16 rows of 5 to 1600 inputs (masked after a random count with bf16's minimum, as eager
attention adds its mask) and torch's bf16 probabilities, keeping the rows where the textbook form (a correctly
rounded `exp`, a sum in order, a division) rounds differently, and those where only the exp is correctly
rounded does.

For each product the script draws bf16 operands, checks that the emulation reproduces every output of torch's
`matmul`, and keeps 48 columns of the second operand (keys, or the values' channels): those where a sum in
another order (in order one input at a time, pairs with the even input's product first, one run of pairs over
every key) rounds differently, then random ones. The goldens are torch's `matmul` of the kept columns."""

import json

import common
import numpy as np
import torch
from gen_torch_linears import as_bf16, pair_sums
from safetensors.torch import load_file
from safetensors.torch import save as st_save

FIXTURE = common.FIXTURES / "torch_attention"
ROWS = 64
WIDTH = 128
KEYS = 1600
CANDIDATES = 2048
KEEP = 48
# Softmax widths: fewer than a vector (5), a vector and a half (24), up to a real window (352) and 1600 keys.
SOFTMAX_WIDTHS = [5, 24, 100, 352, 1600]
SOFTMAX_ROWS = 32


def textbook_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax with a correctly rounded exp, an in-order sum and a division, in f32."""
    e = np.exp((x - x.max(-1, keepdims=True)).astype(np.float64)).astype(np.float32)
    s = np.zeros(x.shape[0], np.float32)
    for i in range(x.shape[1]):
        s = (s + e[:, i]).astype(np.float32)
    return (e / s[:, None]).astype(np.float32)


def lanes_softmax(x: np.ndarray) -> np.ndarray:
    """torch's structure (16 lanes halved, `1 / sum` multiplied) with a correctly rounded exp, in f32: rows
    where it parts from torch are the ones that hold the exp to Sleef's."""
    e = np.exp((x - x.max(-1, keepdims=True)).astype(np.float64)).astype(np.float32)
    n = e.shape[1]
    if n < 16:
        s = np.zeros(e.shape[0], np.float32)
        for i in range(n):
            s = (s + e[:, i]).astype(np.float32)
    else:
        padded = np.zeros((e.shape[0], -(-n // 16) * 16), np.float32)
        padded[:, :n] = e
        acc = np.zeros((e.shape[0], 16), np.float32)
        for v in range(padded.shape[1] // 16):
            acc = (acc + padded[:, 16 * v:16 * v + 16]).astype(np.float32)
        while acc.shape[1] > 1:
            h = acc.shape[1] // 2
            acc = (acc[:, :h] + acc[:, h:]).astype(np.float32)
        s = acc[:, 0]
    r = (np.float32(1) / s).astype(np.float32)
    return (e * r[:, None]).astype(np.float32)


def torch_probs(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1, dtype=torch.float32).to(torch.bfloat16)


def in_order(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for i in range(x.shape[1]):
        acc = (acc + np.outer(x[:, i], w[:, i])).astype(np.float32)
    return acc


def even_first(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pairs with the even input's product added first: the other order within a pair."""
    swap = np.arange(x.shape[1]).reshape(-1, 2)[:, ::-1].reshape(-1)
    return pair_sums(x[:, swap], w[:, swap], x.shape[1])


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` as eager attention calls it: one head of a batch of one, 4-D."""
    return torch.matmul(a[None, None], b[None, None])[0, 0]


def keep_columns(x: torch.Tensor, w: torch.Tensor, y: np.ndarray, others, rng) -> tuple[np.ndarray, int]:
    """Indices of `KEEP` rows of `w` (`x @ w.T` columns): where another order parts from torch first."""
    xf, wf = x.float().numpy(), w.float().numpy()
    parted = np.zeros(w.shape[0], bool)
    for other in others:
        parted |= (as_bf16(other(xf, wf)) != y).any(axis=0)
    sensitive = np.flatnonzero(parted)[:KEEP]
    rest = rng.permutation(np.flatnonzero(~parted))[: KEEP - len(sensitive)]
    return np.sort(np.concatenate([sensitive, rest])), len(sensitive)


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    common.stage_dir(FIXTURE, args.check, torch.bfloat16)
    gen = torch.Generator().manual_seed(common.SEED)
    rng = np.random.default_rng(common.SEED)
    tensors = {}
    notes = []
    if args.check:
        # Recompute torch's outputs of the committed operands (which columns were kept depends on the CPU).
        c = load_file(FIXTURE / "attention.safetensors")
        tensors.update(c)
        tensors["scores"] = matmul(c["q"], c["k"].T)
        tensors["outputs"] = matmul(c["probs"], c["v"])
        for n in SOFTMAX_WIDTHS:
            tensors[f"softmax.{n}"] = torch_probs(c[f"logits.{n}"])
        notes = json.loads((FIXTURE / "provenance.json").read_text())["notes"][:-1]
    else:
        # Scores: queries against candidate keys over the head's width.
        q = torch.randn(ROWS, WIDTH, generator=gen).to(torch.bfloat16)
        k = (torch.randn(CANDIDATES, WIDTH, generator=gen) * 2).to(torch.bfloat16)
        s = matmul(q, k.T).float().numpy()
        qf, kf = q.float().numpy(), k.float().numpy()
        assert np.array_equal(as_bf16(pair_sums(qf, kf, 1024)), s), "scores: pairs are not torch's order here"
        keep, n = keep_columns(q, k, s, (in_order, even_first), rng)
        tensors["q"], tensors["k"] = q, k[torch.from_numpy(keep)]
        tensors["scores"] = matmul(q, tensors["k"].T)
        notes.append(f"scores {ROWS}x{WIDTH}: {n} of {KEEP} kept keys round differently in another order")
        # Outputs: a softmax's probabilities over every key against candidate value channels.
        logits = torch.randn(ROWS, KEYS, generator=gen) * 3
        probs = torch.softmax(logits, -1).to(torch.bfloat16)
        v = torch.randn(KEYS, CANDIDATES, generator=gen).to(torch.bfloat16)
        o = matmul(probs, v).float().numpy()
        pf, vt = probs.float().numpy(), v.T.float().numpy()
        assert np.array_equal(as_bf16(pair_sums(pf, vt, 1024)), o), "outputs: blocks of pairs are not torch's"
        one_run = lambda x, w: pair_sums(x, w, KEYS)  # noqa: E731
        keep, n = keep_columns(probs, v.T, o, (in_order, even_first, one_run), rng)
        tensors["probs"], tensors["v"] = probs, v[:, torch.from_numpy(keep)].contiguous()
        tensors["outputs"] = matmul(probs, tensors["v"])
        notes.append(f"outputs {ROWS}x{KEYS}: {n} of {KEEP} kept channels round differently in another order")
        for width in SOFTMAX_WIDTHS:
            rows = 16384
            x = (torch.randn(rows, width, generator=gen) * 3).to(torch.bfloat16)
            valid = torch.randint(1, width + 1, (rows, 1), generator=gen)
            mask = torch.where(torch.arange(width)[None] < valid, 0.0, torch.finfo(torch.bfloat16).min)
            x = x + mask.to(torch.bfloat16)
            y = torch_probs(x)
            half = SOFTMAX_ROWS // 2
            parted = []
            for form in (lanes_softmax, textbook_softmax):
                other = torch.from_numpy(form(x.float().numpy())).to(torch.bfloat16)
                rows_parted = np.flatnonzero((other != y).any(-1).numpy())
                parted.append(np.setdiff1d(rows_parted, np.concatenate(parted) if parted else [])[:half])
            sensitive = np.concatenate(parted)
            rest = rng.permutation(np.setdiff1d(np.arange(rows), sensitive))
            keep = np.sort(np.concatenate([sensitive, rest[: SOFTMAX_ROWS - len(sensitive)]]))
            tensors[f"logits.{width}"] = x[torch.from_numpy(keep)].contiguous()
            tensors[f"softmax.{width}"] = y[torch.from_numpy(keep)].contiguous()
            notes.append(f"softmax over {width}: of {SOFTMAX_ROWS} kept rows, {len(parted[0])} round differently "
                         f"with a correctly rounded exp, {len(parted[1])} more in the textbook form")
    data = st_save(dict(sorted(tensors.items())), metadata={"block_inputs": "1024"})
    common.emit(FIXTURE / "attention.safetensors", data, args.check)
    common.write_provenance(FIXTURE, "gen_torch_attention.py", "torch: torch.matmul in bf16 and torch.softmax to f32 on CPU (eager attention)",
                            {"attention": "a head's scores and outputs at real widths, torch's bf16 matmul of them; bf16 rows and "
                                           "torch's softmax of them in f32, rounded to bf16"},
                            args.check, notes=notes + ["torch's CPU kernels' own results, in bf16"],
                            dtype="bfloat16")
    common.finish(FIXTURE)


if __name__ == "__main__":
    main()
