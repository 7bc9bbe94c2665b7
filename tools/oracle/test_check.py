"""Tests of the oracle's --check (check.py): it passes what another CPU changes and fails a real change.

    $ORACLE_VENV/bin/python tools/oracle/test_check.py     # run by tools/test.sh after regen.sh --check

The end-to-end case copies the committed qwen2 fixture, perturbs one weight of its checkpoint by 0.01 and
runs `gen_qwen2.py --check` against the copy: the check must fail, naming both the checkpoint tensor and
the goldens the perturbed checkpoint no longer reproduces.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import check  # noqa: E402

FIXTURES = HERE.parents[1] / "tests" / "fixtures"


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    header, body, offset = {}, b"", 0
    kinds = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name]).tobytes()
        header[name] = {"dtype": kinds[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        body += raw
        offset += len(raw)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


class Bounds(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp())
        (self.dir / "fx").mkdir()

    def tearDown(self) -> None:
        shutil.rmtree(self.dir)

    def run_check(self, old: dict[str, np.ndarray], new: dict[str, np.ndarray], bf16: bool = False):
        path = self.dir / "fx" / "g.safetensors"
        path.write_bytes(safetensors_bytes(old))
        c = check.FixtureCheck(self.dir / "fx", bf16=bf16)
        c.safetensors(path, safetensors_bytes(new))
        return c

    def test_f32_floats_pass_within_the_bound_and_fail_beyond_it(self) -> None:
        ref = np.linspace(-5, 5, 40, dtype=np.float32).reshape(4, 10)
        ok = self.run_check({"logits": ref}, {"logits": ref + np.float32(1.5e-5)})
        self.assertEqual(ok.failures, [])
        self.assertAlmostEqual(ok.largest.diff, 1.5e-5, delta=1e-6)
        bad = self.run_check({"logits": ref}, {"logits": ref + np.float32(3e-5)})
        self.assertEqual(len(bad.failures), 1)
        self.assertIn("g.safetensors:logits: 40 of 40 values beyond the bound", bad.failures[0])

    def test_integer_stages_are_exact(self) -> None:
        ids = np.arange(8, dtype=np.int64)
        moved = ids.copy()
        moved[3] += 1
        self.assertEqual(self.run_check({"greedy_tokens": ids}, {"greedy_tokens": ids}).failures, [])
        c = self.run_check({"greedy_tokens": ids}, {"greedy_tokens": moved})
        self.assertIn("1 of 8 values differ (compared exactly)", c.failures[0])

    def test_a_changed_shape_fails(self) -> None:
        c = self.run_check({"logits": np.zeros((2, 3), np.float32)}, {"logits": np.zeros((3, 2), np.float32)})
        self.assertIn("header differs", c.failures[0])

    def test_bf16_bound_is_three_steps_at_the_row_scale(self) -> None:
        # A row whose largest magnitude is in [2, 4): a bf16 step there is 2^-6.
        ref = np.array([[3.5, 0.0, -1.0, 0.25]], dtype=np.float32)
        step = 2.0**-6
        ok = self.run_check({"decode_logits": ref}, {"decode_logits": ref + np.float32(3 * step)}, bf16=True)
        self.assertEqual(ok.failures, [])
        bad = self.run_check({"decode_logits": ref}, {"decode_logits": ref + np.float32(3 * step + 1e-3)}, bf16=True)
        self.assertEqual(len(bad.failures), 1)

    def test_bf16_step(self) -> None:
        got = check.bf16_step(np.array([1.0, 1.5, 2.0, 3.99, 4.0, 0.0, -6.0]))
        self.assertEqual(got.tolist(), [2**-7, 2**-7, 2**-6, 2**-6, 2**-5, 0.0, 2**-5])

    def test_json_floats_have_bounds_and_the_rest_is_exact(self) -> None:
        c = check.FixtureCheck(self.dir / "fx")
        c.json_within("g.json", {"a": 1.0, "ids": [1, 2]}, {"a": 1.0 + 1e-5, "ids": [1, 2]}, None)
        self.assertEqual(c.failures, [])
        c.json_within("g.json", {"ids": [1, 2]}, {"ids": [1, 3]}, None)
        self.assertIn("g.json:ids[1]: 2 != 3", c.failures[0])


class Provenance(unittest.TestCase):
    def run_check(self, committed: dict, recomputed: dict) -> list[str]:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "fx").mkdir()
            path = Path(tmp) / "fx" / "provenance.json"
            path.write_text(json.dumps(committed))
            c = check.FixtureCheck(Path(tmp) / "fx")
            c.provenance(path, json.dumps(recomputed).encode())
            return c.failures

    def test_the_cpu_and_the_python_patch_release_may_differ_and_nothing_else(self) -> None:
        made = {"cpu": {"model": "A"}, "seed": 1, "versions": {"python": "3.11.7", "torch": "2.15.0"}}
        other_machine = {"cpu": {"model": "B"}, "seed": 1, "versions": {"python": "3.11.2", "torch": "2.15.0"}}
        self.assertEqual(self.run_check(made, other_machine), [])
        other_minor = {**other_machine, "versions": {"python": "3.12.1", "torch": "2.15.0"}}
        self.assertIn("the oracle's lock is for 3.11", self.run_check(made, other_minor)[0])
        other_torch = {**other_machine, "versions": {"python": "3.11.7", "torch": "2.16.0"}}
        self.assertIn('versions differs: torch: "2.15.0" != "2.16.0"', self.run_check(made, other_torch)[0])


class PerturbedWeight(unittest.TestCase):
    def test_the_check_fails_when_one_weight_moves(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "qwen2"
            shutil.copytree(FIXTURES / "qwen2", copy)
            ckpt = copy / "model.safetensors"
            data = bytearray(ckpt.read_bytes())
            (n,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8 : 8 + n])
            name = "model.layers.0.mlp.down_proj.weight"
            self.assertEqual(header[name]["dtype"], "F32")
            at = 8 + n + header[name]["data_offsets"][0]
            (w,) = struct.unpack("<f", data[at : at + 4])
            data[at : at + 4] = struct.pack("<f", w + 0.01)
            ckpt.write_bytes(bytes(data))
            env = dict(os.environ, MLXCEL_ORACLE_FIXTURES=tmp)
            out = subprocess.run([sys.executable, str(HERE / "gen_qwen2.py"), "--check"], env=env,
                                 capture_output=True, text=True, timeout=600)
        report = out.stdout + out.stderr
        self.assertNotEqual(out.returncode, 0, report)
        self.assertIn(f"qwen2/model.safetensors:{name}: 1 of", report)
        for variant in ("short", "long"):
            self.assertIn(f"qwen2/goldens/{variant}.safetensors:logits:", report)


if __name__ == "__main__":
    unittest.main(verbosity=2)
