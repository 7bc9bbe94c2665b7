#!/usr/bin/env python3
"""One linear's arithmetic rate, torch beside IREE, on this CPU: what the prefill and encoder figures of
compare.py are bound by, and whether torch's bf16 sums are the ones the numeric contract states here.

For `x [rows, inputs] @ w [out, inputs]^T` (default: a 64-row prompt chunk and a 311-row prompt through
Qwen2-VL-2B's gate projection, 1536 to 8960) it times, with 2 threads, medians:

  torch          torch's bf16 `linear` as transformers calls it (oneDNN: AMX tiles on CPUs that have them)
  torch-avx512   the same with oneDNN held to `AVX512_CORE_BF16` (`vdpbf16ps`, what CPUs without AMX run)
  iree-pairs     the decoder graph's bf16-compute contraction: `linalg.mmt4d` of bf16 tiles 16 rows by 2
                 inputs through IREE's microkernel (`vdpbf16ps`)
  iree-f32       its f32-compute contraction: f32 rows by bf16 weight tiles of 32 rows, widened inside

The IREE forms are compiled with the host's flags (`--iree-llvmcpu-target-cpu=host`) by the project venv's
`iree-compile`, and timed by `iree-benchmark-module` from PyPI `iree-base-runtime` of the same version
(installed into a venv of its own under ~/.cache/mlxcel when missing). The dumped assembly is searched for AMX
tile instructions, and the CPU's AMX flags are printed beside it.

With --fixtures it also recomputes torch's outputs of the committed operands of tests/fixtures/torch_linears
and torch_attention on this CPU and counts the bf16 values that differ from the goldens (made on the CPU their
provenance.json names): which of torch's orders this CPU's kernels reproduce.

    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/gemm_rates.py [--rows 64,311] [--fixtures]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IREE_VERSION = "3.13.0"
RUNTIME_VENV = Path(os.environ.get("MLXCEL_CACHE", Path.home() / ".cache/mlxcel")) / "iree-runtime-venv"


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def torch_ms(rows: int, inputs: int, out: int, threads: int, isa: str | None) -> float:
    """The median time of torch's bf16 linear, in a child process (oneDNN reads its ISA cap at start)."""
    code = f"""
import time, torch
torch.set_num_threads({threads})
g = torch.Generator().manual_seed(0)
x = torch.randn({rows}, {inputs}, generator=g).bfloat16(); w = torch.randn({out}, {inputs}, generator=g).bfloat16()
for _ in range(3): torch.nn.functional.linear(x, w)
ts = []
for _ in range(20):
    t = time.perf_counter(); torch.nn.functional.linear(x, w); ts.append(time.perf_counter() - t)
print(sorted(ts)[10] * 1e3)
"""
    env = dict(os.environ)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    out_s = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return float(out_s.stdout.strip().splitlines()[-1])


def mmt4d_module(rows: int, inputs: int, out: int, form: str) -> tuple[str, list[str]]:
    """The contraction as the decoder graph emits it (`NumericContract::linear_tiled_rows`), and its inputs."""
    m0 = 16
    if form == "pairs":
        lhs, rhs = f"{rows // m0}x{inputs // 2}x16x2xbf16", f"{out // 16}x{inputs // 2}x16x2xbf16"
        res = f"{rows // m0}x{out // 16}x16x16xf32"
    else:
        lhs, rhs = f"{rows // m0}x{inputs}x16x1xf32", f"{out // 32}x{inputs}x32x1xbf16"
        res = f"{rows // m0}x{out // 32}x16x32xf32"
    mlir = f"""func.func @main(%a: tensor<{lhs}>, %b: tensor<{rhs}>) -> tensor<{res}> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{res}>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<{res}>) -> tensor<{res}>
  %r = linalg.mmt4d ins(%a, %b : tensor<{lhs}>, tensor<{rhs}>) outs(%f : tensor<{res}>) -> tensor<{res}>
  return %r : tensor<{res}>
}}
"""
    return mlir, [f"--input={lhs}=1", f"--input={rhs}=1"]


def benchmark_module() -> Path:
    tool = RUNTIME_VENV / "bin/iree-benchmark-module"
    if not tool.exists():
        print(f"gemm_rates: installing iree-base-runtime=={IREE_VERSION} into {RUNTIME_VENV}", file=sys.stderr)
        subprocess.run(["python3", "-m", "venv", str(RUNTIME_VENV)], check=True)
        subprocess.run([str(RUNTIME_VENV / "bin/pip"), "install", "-q", "--disable-pip-version-check",
                        f"iree-base-runtime=={IREE_VERSION}"], check=True)
    return tool


def iree_ms(rows: int, inputs: int, out: int, form: str, work: Path) -> tuple[float, int]:
    """The median time of the contraction on IREE's local-task driver over both cores, and how many AMX tile
    instructions its assembly holds."""
    mlir, inputs_flags = mmt4d_module(rows, inputs, out, form)
    src, vmfb, dump = work / f"{form}-{rows}.mlir", work / f"{form}-{rows}.vmfb", work / f"{form}-{rows}"
    src.write_text(mlir)
    ukernels = "mmt4d" if form == "pairs" else "none"
    subprocess.run([str(REPO / ".venv/bin/iree-compile"), str(src), "--iree-hal-target-backends=llvm-cpu",
                    "--iree-llvmcpu-target-cpu=host", f"--iree-llvmcpu-enable-ukernels={ukernels}",
                    f"--iree-hal-dump-executable-intermediates-to={dump}", "-o", str(vmfb)], check=True)
    asm = "".join(p.read_text() for p in dump.glob("*.s"))
    amx = len(re.findall(r"\b(tileloadd|tdpbf16ps|tdpbssd|tilestored)\b", asm))
    run = subprocess.run([str(benchmark_module()), f"--module={vmfb}", "--function=main", "--device=local-task",
                          "--task_topology_cpu_ids=0,1", "--benchmark_repetitions=5", *inputs_flags],
                         check=True, capture_output=True, text=True)
    median = [l for l in run.stdout.splitlines() if "real_time_median" in l][0]
    value, unit = re.search(r"real_time_median\s+([\d.]+) (ms|us|s)\b", median).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit], amx


def fixture_differences() -> dict:
    """bf16 values of torch's outputs, recomputed here from the committed operands, unlike the goldens."""
    import torch
    from safetensors.torch import load_file

    def differ(a, b) -> int:
        return int((a.view(torch.int16) != b.view(torch.int16)).sum())

    fixtures = REPO / "tests/fixtures"
    out = {}
    lin = load_file(fixtures / "torch_linears/linears.safetensors")
    shapes = sorted(k[2:] for k in lin if k.startswith("y."))
    out["linears"] = {s: [differ(torch.nn.functional.linear(lin[f"x.{s}"], lin[f"w.{s}"]), lin[f"y.{s}"]),
                          lin[f"y.{s}"].numel()] for s in shapes}
    att = load_file(fixtures / "torch_attention/attention.safetensors")

    def mm(a, b):
        return torch.matmul(a[None, None], b[None, None])[0, 0]

    out["attention"] = {
        "scores": [differ(mm(att["q"], att["k"].transpose(0, 1)), att["scores"]), att["scores"].numel()],
        "outputs": [differ(mm(att["probs"], att["v"]), att["outputs"]), att["outputs"].numel()],
    }
    out["softmax"] = {k[8:]: [differ(torch.softmax(att["logits." + k[8:]], -1, dtype=torch.float32)
                                     .to(torch.bfloat16), att[k]), att[k].numel()]
                      for k in sorted(att) if k.startswith("softmax.")}
    out["goldens_from"] = json.loads((fixtures / "torch_linears/provenance.json").read_text()).get("cpu")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="64,311", help="rows of x, comma-separated (IREE's forms at multiples of 16)")
    ap.add_argument("--inputs", type=int, default=1536)
    ap.add_argument("--out", type=int, default=8960)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixtures", action="store_true", help="also torch's outputs against the torch_* goldens")
    args = ap.parse_args()
    try:
        rows_list = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows takes whole numbers separated by commas, not {args.rows!r}")
    if min(rows_list + [args.inputs, args.out, args.threads]) < 1:
        ap.error("--rows, --inputs, --out and --threads must be positive")
    if args.inputs % 2 or args.out % 32:
        ap.error("IREE's tiles need an even --inputs and an --out that is a multiple of 32")
    if not (REPO / ".venv/bin/iree-compile").exists():
        ap.error(f"{REPO / '.venv/bin/iree-compile'} is missing: run `. tools/dev/setup.sh` first")
    import torch

    torch.set_num_threads(args.threads)
    flags = cpu_flags()
    report = {"cpu_amx": sorted(f for f in flags if f.startswith("amx")),
              "avx512_bf16": "avx512_bf16" in flags, "torch": torch.__version__, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for rows in rows_list:
            flop = 2 * rows * args.inputs * args.out
            line = {}
            for name, isa in (("torch", None), ("torch-avx512", "AVX512_CORE_BF16")):
                ms = torch_ms(rows, args.inputs, args.out, args.threads, isa)
                line[name] = {"ms": round(ms, 3), "gflops": round(flop / ms / 1e6)}
            if rows % 16 == 0:
                for form in ("pairs", "f32"):
                    ms, amx = iree_ms(rows, args.inputs, args.out, form, Path(tmp))
                    line[f"iree-{form}"] = {"ms": round(ms, 3), "gflops": round(flop / ms / 1e6),
                                            "amx_instructions": amx}
            report["rows"][rows] = line
            print(f"{rows} x {args.inputs} -> {args.out}: " + ", ".join(
                f"{k} {v['ms']} ms ({v['gflops']} GFLOP/s)" for k, v in line.items()), flush=True)
    if args.fixtures:
        report["fixtures"] = fixture_differences()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
