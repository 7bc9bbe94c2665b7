#!/usr/bin/env python3
"""STREAM-like memory bandwidth with numpy, on N threads (numpy releases the GIL; each thread works on its
own contiguous share of the arrays, which are far larger than the last-level cache).

Kernels, bytes counted as STREAM does (no write-allocate traffic):
  copy   c = a            2 x 8 B per element
  scale  b = s * c        2 x 8 B
  triad  a = b + s * c    numpy has no fused triad: two passes (a = s * c; a += b), counted as the 5 x 8 B moved
  read   sum(a)           1 x 8 B (read-only, the access pattern of weights in a decode step)

Best of --reps per kernel, as STREAM reports. Prints one JSON object.

    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/membw.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np


def _run(threads: int, work, n: int, reps: int, nbytes: int) -> float:
    bounds = [(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
    best = 0.0
    for _ in range(reps):
        ts = [threading.Thread(target=work, args=b) for b in bounds]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def measure(threads: int = 2, mib: int = 256, reps: int = 5) -> dict:
    """GB/s per kernel (1e9 bytes per second)."""
    n = mib * 1024 * 1024 // 8
    a = np.ones(n)
    b = np.full(n, 2.0)
    c = np.zeros(n)
    s = 3.0

    def copy(lo, hi):
        np.copyto(c[lo:hi], a[lo:hi])

    def scale(lo, hi):
        np.multiply(c[lo:hi], s, out=b[lo:hi])

    def triad(lo, hi):
        np.multiply(c[lo:hi], s, out=a[lo:hi])
        np.add(a[lo:hi], b[lo:hi], out=a[lo:hi])

    def read(lo, hi):
        a[lo:hi].sum()

    out = {"threads": threads, "array_mib": mib, "reps": reps}
    for name, work, arrays in (("copy", copy, 2), ("scale", scale, 2), ("triad", triad, 5), ("read", read, 1)):
        work(0, n)  # touch every page first
        out[f"{name}_GBps"] = round(_run(threads, work, n, reps, arrays * 8 * n), 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mib", type=int, default=256, help="size of each of the three arrays")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(json.dumps(measure(args.threads, args.mib, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
