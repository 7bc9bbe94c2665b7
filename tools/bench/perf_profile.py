#!/usr/bin/env python3
"""Where mlxcel-host's time goes: `perf` samples of a running server, attributed to IREE dispatches.

Starts `mlxcel-host serve --slots 1` on a checkpoint, warms it up (the image encoder bucket loaded), then
records `perf record -e cpu-clock` on the server process during (1) one text request that decodes --new
tokens (the decode step) and (2) one image request that stops at its first token (the image encoder and the
LM prefill). IREE runs the compiled code from ELF images its own loader maps into anonymous memory, which
perf cannot name; this script finds each mapped image in the process (/proc/PID/maps and /proc/PID/mem),
matches it to an ELF inside a compile-cache entry (the decoder bundle, the encoder buckets), and names each
sample by the dispatch its address falls in (the dispatch names come from the library's export table).
Everything else keeps perf's own symbol (the IREE runtime and the host are in the mlxcel-host binary).

    ~/.cache/mlxcel/oracle-venv/bin/python tools/bench/perf_profile.py --model ~/.cache/mlxcel/bench/qwen2vl-2b-f32-L8-V8

Needs `perf` (Debian: linux-perf) and permission to profile the process (root, or perf_event_paranoid <= 1).
Prints the top items per phase; --json writes everything.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402  (the HTTP client and the host paths)

CACHE = Path(os.environ.get("MLXCEL_CACHE_DIR", Path.home() / ".cache" / "mlxcel" / "compiled"))


# ------------------------------------------------------------------------------------------------
# the ELF images inside compile-cache entries


class Image:
    """One IREE executable library: its executable segment and its dispatches by entry address."""

    def __init__(self, module: str, elf: bytes):
        self.module, self.elf = module, elf
        phoff, = struct.unpack_from("<Q", elf, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
        self.text = None
        for i in range(phnum):
            p_type, p_flags, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", elf, phoff + i * phentsize)
            if p_type == 1 and p_flags & 1:  # PT_LOAD, executable
                self.text = (p_offset, p_vaddr, p_filesz)
        self.entries, self.names = self._exports()

    def _sections(self):
        shoff, = struct.unpack_from("<Q", self.elf, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", self.elf, 0x3A)
        raw = [struct.unpack_from("<IIQQQQIIQQ", self.elf, shoff + i * shentsize) for i in range(shnum)]
        names_off = raw[shstrndx][4]

        def name(off):
            end = self.elf.index(b"\0", names_off + off)
            return self.elf[names_off + off:end].decode()

        return {name(s[0]): s for s in raw}

    def _exports(self):
        """Dispatch entry points paired with their names: the library's export table holds an array of
        function pointers and an array of name pointers, both filled by R_X86_64_RELATIVE relocations in
        export order."""
        secs = self._sections()
        text = secs[".text"]
        t_lo, t_hi = text[3], text[3] + text[5]
        rela = secs.get(".rela.dyn")
        fn_ptrs, name_ptrs = [], []
        if rela:
            for off in range(rela[4], rela[4] + rela[5], 24):
                r_offset, r_info, addend = struct.unpack_from("<QQq", self.elf, off)
                if r_info & 0xFFFFFFFF != 8:  # R_X86_64_RELATIVE
                    continue
                if t_lo <= addend < t_hi:
                    fn_ptrs.append((r_offset, addend))
                else:
                    s = self._string_at(addend)
                    if s and "_dispatch_" in s:
                        name_ptrs.append((r_offset, s))
        fn_ptrs.sort()
        name_ptrs.sort()
        # The two arrays are the longest runs of consecutive slots of the same length. Other
        # pointers can land on a name too: the linker merges a string that is the tail of a longer
        # one into it (in an encoder, a pointer to `_dispatch_5_...`, the tail of `main_dispatch_5_...`).
        pair = max(
            ((f, m) for f in _runs(fn_ptrs) for m in _runs(name_ptrs) if len(f) == len(m)),
            key=lambda fm: len(fm[0]),
            default=None,
        )
        if pair is None:
            pairs = [(a, f"{self.module}:fn@{a:#x}") for _, a in fn_ptrs]
        else:
            pairs = [(a, f"{self.module}:{nm}") for (_, a), (_, nm) in zip(*pair)]
        pairs.sort()
        return [a for a, _ in pairs], [nm for _, nm in pairs]

    def _string_at(self, vaddr: int) -> str | None:
        # .rodata lives in the first (read-only) segment, whose file offset equals its vaddr here.
        if not 0 <= vaddr < len(self.elf):
            return None
        end = self.elf.find(b"\0", vaddr, vaddr + 512)
        if end <= vaddr:
            return None
        try:
            return self.elf[vaddr:end].decode("ascii")
        except UnicodeDecodeError:
            return None

    def name_of(self, vaddr: int) -> str:
        i = bisect.bisect_right(self.entries, vaddr) - 1
        return self.names[i] if i >= 0 else f"{self.module}:(before first dispatch)"


def _runs(ptrs):
    out, cur = [], []
    for p in ptrs:
        if cur and p[0] != cur[-1][0] + 8:
            out.append(cur)
            cur = []
        cur.append(p)
    if cur:
        out.append(cur)
    return out


def cache_images() -> list[Image]:
    """Every ELF inside the decoder and encoder entries of the compile cache."""
    out = []
    for f in CACHE.glob("*.mlxvmfb"):
        b = f.read_bytes()
        # The entry's layout: a magic line, the header's length (u64, little-endian), the JSON header.
        magic = b"MLXCELVMFB1\n"
        if not b.startswith(magic):
            continue
        n, = struct.unpack_from("<Q", b, len(magic))
        header = json.loads(b[len(magic) + 8:len(magic) + 8 + n])
        module = header.get("name", f.stem)
        pos = 0
        while (i := b.find(b"\x7fELF", pos)) >= 0:
            e = b[i:]
            try:
                shoff, = struct.unpack_from("<Q", e, 0x28)
                shentsize, shnum = struct.unpack_from("<HH", e, 0x3A)
                out.append(Image(module, e[:shoff + shentsize * shnum]))
            except (struct.error, ValueError, KeyError, IndexError):
                pass
            pos = i + 4
    return out


def mapped_images(pid: int, images: list[Image]) -> list[tuple[int, int, Image]]:
    """(start, end, image) for each anonymous executable mapping of the process that holds a known image."""
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            parts = line.split()
            if "x" not in parts[1] or len(parts) > 5:  # file-backed mappings have a path
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            for img in images:
                if img.text is None:
                    continue
                off, vaddr, size = img.text
                if hi - lo < (vaddr & 0xFFF) + size:
                    continue
                # The whole executable segment: graphs that differ only in later dispatches (the
                # same model's encoder before and after a change of its weight tiles) share a
                # prefix, and naming samples by the wrong image names the wrong dispatches.
                mem.seek(lo + (vaddr & 0xFFF))
                try:
                    if mem.read(size) == img.elf[off:off + size]:
                        found.append((lo, hi, img))
                        break
                except OSError:
                    break
    return found


# ------------------------------------------------------------------------------------------------
# perf


def record(pid: int, out: Path, freq: int, work) -> float:
    p = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", str(freq), "-p", str(pid), "-o", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    t0 = time.perf_counter()
    work()
    dt = time.perf_counter() - t0
    p.send_signal(signal.SIGINT)
    _, err = p.communicate()
    if p.returncode not in (0, -2, 130) or not out.exists():
        sys.exit(f"profile: perf record failed: {err.decode()[-2000:]}")
    return dt


def attribute(data: Path, regions) -> collections.Counter:
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True, text=True)
    counts = collections.Counter()
    starts = [r[0] for r in regions]
    for line in script.stdout.splitlines():
        m = re.match(r"\s*([0-9a-f]+)\s+(.*?)\s*\((.*)\)\s*$", line)
        if not m:
            continue
        ip = int(m.group(1), 16)
        sym, dso = m.group(2), m.group(3)
        i = bisect.bisect_right(starts, ip) - 1
        if i >= 0 and ip < regions[i][1]:
            lo, _, img = regions[i]
            counts[img.name_of(ip - lo + (img.text[1] & ~0xFFF))] += 1
        else:
            counts[f"{Path(dso).name}:{sym or hex(ip)}"] += 1
    return counts


def group(name: str) -> str:
    if ":" in name and "_dispatch_" in name:
        module, disp = name.split(":", 1)
        kind = re.sub(r"^.*?_dispatch_\d+_", "", disp)
        kind = re.sub(r"_\d+(x\d+)*.*$", "", kind)
        return f"{module} {kind}"
    if name.startswith("[kernel"):
        return "kernel"
    return name.split(":", 1)[0]


def top(counts: collections.Counter, n: int) -> list[tuple[str, float]]:
    total = sum(counts.values()) or 1
    return [(k, 100.0 * v / total) for k, v in counts.most_common(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--image", type=Path, help="default: the 448x448 synthetic picture compare.py uses")
    ap.add_argument("--new", type=int, default=64, help="tokens decoded in the decode profile")
    ap.add_argument("--streams", type=int, default=1,
                    help="concurrent text requests in the decode profile (the server gets that many slots)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--driver", default="local-task")
    ap.add_argument("--compute", choices=("f32", "bf16"), default="f32",
                    help="bf16: the experimental bf16 compute (--compute bf16 --allow-unqualified)")
    ap.add_argument("--freq", type=int, default=999)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import gen_ckpt

    image = args.image or gen_ckpt.BENCH_DIR / "inputs" / "synthetic-448.png"
    url = "data:image/png;base64," + __import__("base64").b64encode(image.read_bytes()).decode()
    cmd = compare.host_cmd("serve", "--model", str(args.model), "--port", "0", "--slots", str(args.streams), "--context",
                           str(args.context), "--chunk", str(args.chunk), "--driver", args.driver,
                           "--plugins", str(compare.PLUGINS),
                           # The profiled image request repeats the warm-up's image and prompt: without
                           # these its encoder output and prompt rows would be served from the caches.
                           "--encoder-cache-mb", "0", "--no-prefix-cache",
                           *(("--compute", "bf16", "--allow-unqualified") if args.compute == "bf16" else ()))
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = None
    for line in server.stdout:
        if m := re.match(r"listening on http://(\S+)", line):
            addr = m.group(1)
            break
    if addr is None:
        sys.exit("profile: the server did not start")
    threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()
    model = json.loads(compare._get(addr, "/v1/models"))["data"][0]["id"]
    image_msg = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": compare.PROMPT}]
    text_msg = compare.STREAM_PROMPT.format(1)
    result = {"model": str(args.model), "command": " ".join(sys.argv)}
    try:
        compare.sse_request(addr, compare.chat_body(model, image_msg, 2))  # warm-up: encoder bucket loaded
        compare.sse_request(addr, compare.chat_body(model, text_msg, 4))
        regions = sorted(mapped_images(server.pid, cache_images()), key=lambda r: r[0])
        result["mapped_images"] = [{"module": img.module, "bytes": hi - lo, "dispatches": len(img.entries)}
                                   for lo, hi, img in regions]
        with tempfile.TemporaryDirectory(prefix="mlxcel-perf-") as tmp:
            phases = {}

            def decode():
                def one(i):
                    body = compare.chat_body(model, compare.STREAM_PROMPT.format(i + 1), args.new)
                    return compare.sse_request(addr, body)

                with __import__("concurrent.futures").futures.ThreadPoolExecutor(args.streams) as pool:
                    rs = list(pool.map(one, range(args.streams)))
                # Aggregate over the span every stream was decoding.
                start, end = max(r["stamps"][0] for r in rs), min(r["stamps"][-1] for r in rs)
                steps = sum(sum(1 for t in r["stamps"] if start <= t <= end) for r in rs)
                phases["decode_tok_s"] = steps / (end - start) if end > start else None

            def prefill():
                r = compare.sse_request(addr, compare.chat_body(model, image_msg, 1))
                phases["ttft_image_s"] = r["stamps"][0] - r["t0"]

            for name, work in (("decode", decode), ("image_prefill", prefill)):
                data = Path(tmp) / f"{name}.data"
                secs = record(server.pid, data, args.freq, work)
                counts = attribute(data, regions)
                groups = collections.Counter()
                for k, v in counts.items():
                    groups[group(k)] += v
                result[name] = {"seconds": secs, "samples": sum(counts.values()),
                                "top": top(counts, args.top), "groups": top(groups, args.top)}
            result["rates"] = phases
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()

    print(f"mapped IREE images: {result['mapped_images']}")
    print(f"rates while profiled: {result['rates']}")
    for name in ("decode", "image_prefill"):
        r = result[name]
        print(f"\n{name}: {r['samples']} samples over {r['seconds']:.1f} s")
        print("  by kind:")
        for k, pct in r["groups"]:
            print(f"    {pct:5.1f}%  {k}")
        print("  top items:")
        for k, pct in r["top"]:
            print(f"    {pct:5.1f}%  {k}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
