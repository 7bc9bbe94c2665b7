"""`--check`: a recomputed fixture against the committed one, exact where exactness is portable.

torch (and mlx) pick other kernels on another CPU (AVX2, AVX-512, AMX), so the floats a reference
computes move in their last bits from one machine to the next while every token does not. The check
therefore compares:

- exactly: every file that is not a tensor file (configs, tokenizers, templates, images, audio), the
  safetensors headers (names, dtypes, shapes, offsets, metadata), every integer and boolean tensor
  (token ids, input ids, greedy tokens, grids, masks, type ids), every non-float JSON value, and
  `pixel_values` made by the PIL image backend (integer resampling, then one IEEE multiply-add per
  element: the same bits on every CPU);
- floats within a stated bound: F32_ATOL for a reference computed in f32, five times below the parity
  gate of f32 logits (1e-4; measured across CPUs: at most 8.8e-6); for the reference computed in bf16,
  F32_ATOL plus BF16_STEPS bf16 rounding steps at the largest magnitude of the value's row (last axis).
  A bf16 result is exact or moves by whole steps, and a value that is small by cancellation moves at the
  scale of its row, not its own; once one rounding flips in the KV cache the later decode steps drift
  further (measured: 2.3e-2 between AMD Zen 3 and Zen 4, 3.1e-2 on an Intel Xeon with AMX, both at
  decode logits of magnitude below 4, where a step is 2^-6). That bound, 0.047 there, stays under the
  0.08 within which mlxcel-host's bf16 decoder is held to transformers-bf16 (an experimental closeness,
  not a parity gate). Greedy margins are differences of two decode logits, so they get twice the bound
  of their larger logit.

Every difference is measured; the largest per fixture is printed, and any beyond its bound fails the
check with the file, stage, difference and bound. Provenance must match except for the CPU it records
and the interpreter's patch release (the minor version, which the lock's wheels are built for, must).
"""

from __future__ import annotations

import json
import platform
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

F32_ATOL = 2e-5
BF16_STEPS = 3
# The stages compared bit for bit even though they are floats (see the module doc).
EXACT_FLOAT_STAGES_PIL = frozenset({"pixel_values"})
MARGIN_STAGE = "greedy_margins"
MARGIN_KEY = "min_greedy_margin"

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bf16",
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


class Mismatch(RuntimeError):
    pass


def cpu() -> dict[str, str]:
    """The CPU a reference ran on, as far as it decides which kernels torch picks."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "model name", "cpu family", "model") and key not in info:
                info[key] = value.strip()
            if not line.strip() and info:
                break
    except OSError:
        pass
    out = {"machine": platform.machine(), "model": info.get("model name", platform.processor() or "unknown")}
    if "cpu family" in info:
        out["family"] = f"{info.get('vendor_id', '?')} family {info['cpu family']} model {info.get('model', '?')}"
    try:
        import torch

        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        pass
    return out


def read_safetensors(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, tensors) of a safetensors file; bf16 comes back as float32 (exact)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        kind = _ST_DTYPES[spec["dtype"]]
        raw = body[start:end]
        if kind == "bf16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(kind).newbyteorder("<"))
        tensors[name] = arr.reshape(spec["shape"])
    return header, tensors


def bf16_step(x: np.ndarray) -> np.ndarray:
    """The spacing of bf16 values at |x| (8 significant bits): 2^(floor(log2 |x|) - 7)."""
    _, e = np.frexp(np.abs(x).astype(np.float64))  # |x| = m 2^e, m in [0.5, 1)
    return np.where(x == 0, 0.0, np.ldexp(1.0, e - 8))


@dataclass
class Worst:
    diff: float = 0.0
    where: str = "-"
    ratio: float = 0.0  # diff over its bound, at the element closest to failing


@dataclass
class FixtureCheck:
    """The comparisons of one fixture's --check run."""

    fixture: Path
    bf16: bool = False
    failures: list[str] = field(default_factory=list)
    compared: set[Path] = field(default_factory=set)
    largest: Worst = field(default_factory=Worst)
    floats: int = 0

    def bound(self, ref: np.ndarray, new: np.ndarray) -> np.ndarray:
        b = np.full(ref.shape, F32_ATOL)
        if self.bf16 and ref.size:
            scale = np.maximum(np.abs(ref), np.abs(new))
            if scale.ndim:
                scale = scale.max(axis=-1, keepdims=True)
            b = b + BF16_STEPS * bf16_step(scale)
        return b

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.fixture.parent))

    def _committed(self, path: Path) -> bytes | None:
        self.compared.add(path)
        if not path.exists():
            self.failures.append(f"{self._rel(path)}: recomputed, but not in the committed fixture")
            return None
        return path.read_bytes()

    def exact(self, path: Path, data: bytes) -> None:
        old = self._committed(path)
        if old is not None and old != data:
            self.failures.append(f"{self._rel(path)}: differs (compared byte for byte)")

    def safetensors(self, path: Path, data: bytes, meta: dict[str, Any] | None = None) -> None:
        old = self._committed(path)
        if old is None:
            return
        old_header, old_t = read_safetensors(old)
        new_header, new_t = read_safetensors(data)
        if old_header != new_header:
            names = sorted(set(old_header) ^ set(new_header)) or [
                k for k in sorted(old_header) if old_header[k] != new_header.get(k)
            ]
            self.failures.append(f"{self._rel(path)}: header differs (names, dtypes or shapes): {names[:8]}")
            return
        exact_floats = EXACT_FLOAT_STAGES_PIL if (meta or {}).get("image_backend") == "pil" else frozenset()
        for name in sorted(old_t):
            a, b = old_t[name], new_t[name]
            where = f"{self._rel(path)}:{name}"
            if a.dtype.kind != "f" or name in exact_floats:
                if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
                    n = int(np.count_nonzero(a != b))
                    self.failures.append(f"{where}: {n} of {a.size} values differ (compared exactly)")
                continue
            if name == MARGIN_STAGE and "decode_logits" in old_t:
                bound = self.margin_bound(old_t["decode_logits"], new_t["decode_logits"])
            else:
                bound = self.bound(a, b)
            self.floats_within(where, a.astype(np.float64), b.astype(np.float64), bound)

    def margin_bound(self, ref_logits: np.ndarray, new_logits: np.ndarray) -> np.ndarray:
        """Per decode step: twice the bound of the step's larger top-2 logit."""
        top = np.maximum(np.abs(np.sort(ref_logits, axis=-1)[..., -2:]),
                         np.abs(np.sort(new_logits, axis=-1)[..., -2:])).max(-1, keepdims=True)
        return (2 * self.bound(top, top))[..., 0]

    def floats_within(self, where: str, a: np.ndarray, b: np.ndarray, bound: np.ndarray) -> None:
        self.floats += a.size
        same_nan = np.isnan(a) == np.isnan(b)
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        diff = np.where(a == b, 0.0, diff)  # equal infinities
        if not same_nan.all() or not np.isfinite(diff).all():
            self.failures.append(f"{where}: NaN or infinity where the committed value has none")
            return
        if diff.size == 0:
            return
        i = int(np.argmax(diff))
        if diff.flat[i] > self.largest.diff:
            self.largest = Worst(float(diff.flat[i]), where, float(diff.flat[i] / bound.flat[i]))
        over = diff > bound
        if over.any():
            j = int(np.argmax(np.where(over, diff / bound, 0)))
            self.failures.append(
                f"{where}: {int(over.sum())} of {diff.size} values beyond the bound, largest difference "
                f"{diff.flat[j]:.3e} (committed {a.flat[j]:.6g}, recomputed {b.flat[j]:.6g}, bound {bound.flat[j]:.3e})"
            )

    def golden_json(self, path: Path, data: bytes, golden_tensors: bytes) -> None:
        old = self._committed(path)
        if old is None:
            return
        a, b = json.loads(old), json.loads(data)
        _, tensors = read_safetensors(golden_tensors)
        margin = None
        if "decode_logits" in tensors:
            logits = tensors["decode_logits"].astype(np.float64)
            margin = float(self.margin_bound(logits, logits).max())
        self.json_within(self._rel(path), a, b, margin)

    def json_within(self, where: str, a: Any, b: Any, margin: float | None, key: str = "") -> None:
        if isinstance(a, float) and isinstance(b, float):
            bound = margin if key == MARGIN_KEY and margin is not None else float(
                self.bound(np.array([a]), np.array([b]))[0])
            self.floats_within(f"{where}:{key}", np.array([a]), np.array([b]), np.array([bound]))
        elif isinstance(a, dict) and isinstance(b, dict):
            if sorted(a) != sorted(b):
                self.failures.append(f"{where}: keys differ: {sorted(set(a) ^ set(b))}")
                return
            for k in sorted(a):
                self.json_within(where, a[k], b[k], margin, f"{key}.{k}" if key else k)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                self.json_within(where, x, y, margin, f"{key}[{i}]")
        elif a != b or type(a) is not type(b):
            self.failures.append(f"{where}:{key}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]} (compared exactly)")

    def provenance(self, path: Path, data: bytes) -> dict[str, str] | None:
        """Everything but the CPU exactly; returns the CPU the committed goldens were made on."""
        old = self._committed(path)
        if old is None:
            return None
        a, b = json.loads(old), json.loads(data)
        made_on = a.pop("cpu", None)
        b.pop("cpu", None)
        # The interpreter's patch release is the machine's (Debian's 3.11.2, a pyenv 3.11.7), not
        # the reference's: the lock pins every package, and its wheels are for one minor version,
        # which must match.
        py_a, py_b = (d.get("versions", {}).pop("python", None) for d in (a, b))
        minor = lambda v: ".".join(str(v).split(".")[:2])  # noqa: E731
        if minor(py_a) != minor(py_b):
            self.failures.append(f"{self._rel(path)}: python {py_a} made the goldens, {py_b} checks them; "
                                 f"the oracle's lock is for {minor(py_a)}")
        elif made_on is not None:
            made_on = {**made_on, "python": str(py_a)}
        for k in sorted(set(a) | set(b)):
            x, y = a.get(k), b.get(k)
            if x == y:
                continue
            if isinstance(x, dict) and isinstance(y, dict):
                inner = [f"{i}: {json.dumps(x.get(i))} != {json.dumps(y.get(i))}"
                         for i in sorted(set(x) | set(y)) if x.get(i) != y.get(i)]
                self.failures.append(f"{self._rel(path)}: {k} differs: {'; '.join(inner)[:400]}")
            else:
                self.failures.append(f"{self._rel(path)}: {k} differs: {json.dumps(x)[:200]} != {json.dumps(y)[:200]}")
        return made_on

    def finish(self, made_on: dict[str, str] | None) -> None:
        for p in sorted(self.fixture.rglob("*")):
            if p.is_file() and p not in self.compared:
                self.failures.append(f"{self._rel(p)}: committed, but the generator no longer produces it")
        here = {**cpu(), "python": platform.python_version()}
        w = self.largest
        print(f"  check {self.fixture.name}: {len(self.compared)} files, {self.floats} floats; largest float "
              f"difference {w.diff:.3e} at {w.where} ({w.ratio:.2f} of its bound)", flush=True)
        print(f"  check {self.fixture.name}: goldens made on {describe(made_on)}; checked on {describe(here)}",
              flush=True)
        if self.failures:
            raise Mismatch(f"{self.fixture.name}: the recomputed reference differs from the committed fixture:\n  "
                           + "\n  ".join(self.failures))


def describe(c: dict[str, str] | None) -> str:
    if not c:
        return "an unrecorded CPU"
    parts = [c.get("model", "?"), c.get("family", ""), c.get("torch_cpu_capability", "")]
    if c.get("python"):
        parts.append(f"python {c['python']}")
    return ", ".join(p for p in parts if p)
