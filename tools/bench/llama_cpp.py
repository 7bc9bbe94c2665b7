#!/usr/bin/env python3
"""llama.cpp as a third system for tools/bench/compare.py (qwen2_vl only), built by tools/bench/setup_llama_cpp.sh from
the llama-cpp-python sdist's vendor/llama.cpp.

What it runs, per repetition, each a fresh llama-server process (`-t T -tb T`, the prompt caches off: `-cram 0` and
`cache_prompt: false` on every request, so nothing is skipped when a prompt is sent again):

  1 slot   (`-np 1 -c capacity --mmproj`): the image request through the multimodal path (/completion with
           {"prompt_string", "multimodal_data": [png]}) with --new tokens, greedy, EOS ignored: the decode rate of one
           stream over the image prompt's context, as mlxcel-host's `generate --image` measures it; its peak RSS.
  S slots  (`-np S -c S*capacity --mmproj`, one capacity-row cache per slot, as mlxcel-host's `serve --slots S
           --context capacity`): a warm-up image request, then the warm image request's time to first token, a text
           request of as many prompt rows (token ids, the same as mlxcel-host's text request), S concurrent text streams
           (the same stream prompts, as token ids); peak RSS.

Text prompts go as token-id arrays made by the checkpoint's tokenizer and chat template (transformers'), so they are
the ids the other systems run. The image request's text is the chat template's, its image span replaced by mtmd's
media marker (mtmd puts <|vision_start|> and <|vision_end|> around the image tokens itself); llama.cpp tokenizes it,
and its ids are checked against the other systems' prompt ids: the text before and after the image through
llama-server's /tokenize, and the prompt's row count from the server's tokens_evaluated.

The GGUF files (under ~/.cache/mlxcel/bench/gguf/, one per checkpoint and type):
  <checkpoint>.<f32|bf16>.gguf          the text model, by convert_hf_to_gguf.py --outtype (the run's dtype)
  mmproj-<checkpoint>.<f32|bf16>.gguf   the vision tower, convert_hf_to_gguf.py --mmproj
  <checkpoint>.<TYPE>.gguf              llama-quantize's TYPE (--llama-quant, e.g. Q4_K_M) of the run's GGUF

The converter refuses the bench checkpoints' tokenizer as it is: it identifies a BPE pre-tokenizer by hashing the ids
that tokenizer gives a fixed text, and the bench's small vocabulary (384 trained pieces, Qwen2-VL's special ids) gives
a hash no released model has. `convert` below (run with the oracle venv's python) runs the converter unchanged, with
one addition: when the hash is unknown, and only when the tokenizer's pre_tokenizer is exactly Qwen2's (the same split
regex, then byte-level with no prefix space), the pre-tokenizer is named "qwen2", the name the converter gives real
Qwen2-VL checkpoints; anything else is refused as before. And for a vision tower of fewer than 3 blocks (reduced
depth), the projector's tensor-name map is built for 3 indices, so that the merger's visual.merger.mlp.2 (named through
the block-indexed map) is found; the block count written is the tower's.

    PY=~/.cache/mlxcel/oracle-venv/bin/python
    $PY tools/bench/llama_cpp.py convert CHECKPOINT --outtype bf16 --outfile OUT.gguf [--mmproj]
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import sse

CACHE = Path(os.environ.get("MLXCEL_CACHE", Path.home() / ".cache" / "mlxcel"))
ROOT = CACHE / "llama.cpp"
BUILD = ROOT / "build"
BIN = BUILD / "bin"
PYDEPS = ROOT / "pydeps"
GGUF_DIR = Path(os.environ.get("MLXCEL_BENCH_DIR", CACHE / "bench")) / "gguf"  # gen_ckpt.BENCH_DIR / gguf
SETUP = Path(__file__).resolve().parent / "setup_llama_cpp.sh"
NEEDED = ("llama-server", "llama-quantize")
# The families whose checkpoints llama.cpp runs here (its converter knows the others too, untried).
FAMILIES = ("qwen2_vl",)
MEDIA_MARKER = "<__media__>"  # mtmd_default_marker(); llama-server's own is random (GET /props tells it)
IMAGE_SPAN = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen2's pre-tokenizer as its tokenizer.json states it (and llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 quotes it).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def setup_info() -> dict | None:
    f = BUILD / "SETUP.json"
    return json.loads(f.read_text()) if f.exists() else None


def missing() -> str | None:
    """Why llama.cpp cannot run here, or None."""
    info = setup_info()
    if info is None:
        return f"{BUILD / 'SETUP.json'} is missing"
    for b in NEEDED:
        if not (BIN / b).exists():
            return f"{BIN / b} is missing"
    if not (Path(info["source"]) / "convert_hf_to_gguf.py").exists():
        return f"the converter {Path(info['source']) / 'convert_hf_to_gguf.py'} is missing"
    return None


def source() -> Path:
    """The vendor/llama.cpp tree: the one built, else the newest unpacked (the converter needs no build)."""
    info = setup_info()
    if info:
        return Path(info["source"])
    trees = sorted(ROOT.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if not trees:
        sys.exit(f"compare: no llama.cpp source under {ROOT}: run bash {SETUP}")
    return trees[-1]


# ------------------------------------------------------------------------------------------------
# the GGUF files


def _run(cmd: list[str], what: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"compare: {what} failed (exit {p.returncode}): {' '.join(cmd)}\n{(p.stdout + p.stderr)[-4000:]}")


def _convert(model: Path, outtype: str, out: Path, mmproj: bool) -> Path:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".part")
        cmd = [sys.executable, str(Path(__file__).resolve()), "convert", str(model), "--outtype", outtype,
               "--outfile", str(tmp)]
        if mmproj:
            cmd.append("--mmproj")
        print(f"llama.cpp: converting {model.name} to {out.name} ...", file=sys.stderr, flush=True)
        _run(cmd, "convert_hf_to_gguf.py")
        tmp.rename(out)
    return out


def ensure_gguf(model: Path, outtype: str) -> Path:
    """The text model's GGUF at `outtype` (f32 or bf16), converted once."""
    return _convert(model, outtype, GGUF_DIR / f"{model.name}.{outtype}.gguf", mmproj=False)


def ensure_mmproj(model: Path, outtype: str) -> Path:
    """The vision tower's GGUF (mmproj) at `outtype`, converted once."""
    return _convert(model, outtype, GGUF_DIR / f"mmproj-{model.name}.{outtype}.gguf", mmproj=True)


def ensure_quant(model: Path, base: Path, qtype: str, threads: int) -> Path:
    """llama-quantize's `qtype` (Q4_K_M, Q8_0, F16, ...) of the GGUF `base`, made once."""
    out = GGUF_DIR / f"{model.name}.{qtype}.gguf"
    if not out.exists():
        tmp = out.with_name(out.name + ".part")
        print(f"llama.cpp: quantizing {base.name} to {qtype} ...", file=sys.stderr, flush=True)
        _run([str(BIN / "llama-quantize"), str(base), str(tmp), qtype, str(threads)], "llama-quantize")
        tmp.rename(out)
    return out


def convert_main(argv: list[str]) -> int:
    """convert_hf_to_gguf.py's main with `argv`, the vendor tree's gguf-py and conversion package on the path, and
    the Qwen2 pre-tokenizer recognised by its definition when its hash is unknown (see the module docstring)."""
    src = source()
    sys.path[:0] = [str(src / "gguf-py"), str(src), str(PYDEPS)]
    sys.argv = [str(src / "convert_hf_to_gguf.py"), *argv]
    import convert_hf_to_gguf
    from conversion import base

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if not is_qwen2_pretokenizer(tokenizer):
                raise
            base.logger.warning("the BPE pre-tokenizer's hash is unknown (the bench checkpoint's small vocabulary), "
                                "but its pre_tokenizer is Qwen2's exactly: tokenizer.ggml.pre = qwen2")
            return "qwen2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    # The projector's tensor names are looked up in a map built for as many indices as the tower has blocks, and
    # Qwen2-VL's merger is indexed too (visual.merger.mlp.0 and .2): a reduced tower of fewer than 3 blocks (the
    # bench's --vision-blocks 2) leaves mlp.2 unmapped. The map is built for at least 3 indices; the block count
    # written to the GGUF is the tower's own.
    mmproj_init = base.MmprojModel.__init__

    def init(self, *a, **k):
        mmproj_init(self, *a, **k)
        if self.block_count < 3:
            self.tensor_map = base.gguf.get_tensor_name_map(base.gguf.MODEL_ARCH.MMPROJ, 3)

    base.MmprojModel.__init__ = init
    convert_hf_to_gguf.main()
    return 0


def is_qwen2_pretokenizer(tokenizer) -> bool:
    """Whether a transformers tokenizer's backend pre-tokenizer is Qwen2's: the split regex (isolated, not inverted),
    then byte-level without a prefix space or a regex of its own."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None:
        return False
    pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if len(steps) != 2:
        return False
    split, byte_level = steps
    return (split.get("type") == "Split" and split.get("pattern") == {"Regex": QWEN2_SPLIT}
            and split.get("behavior") == "Isolated" and not split.get("invert")
            and byte_level.get("type") == "ByteLevel" and not byte_level.get("add_prefix_space")
            and not byte_level.get("use_regex"))


# ------------------------------------------------------------------------------------------------
# llama-server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama-server process (started through compare.Proc, so its peak RSS and CPU time come from wait4)."""

    def __init__(self, proc_cls, gguf: Path, mmproj: Path | None, slots: int, context: int, threads: int,
                 repack: bool, timeout: float = 1800):
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        cmd = [str(BIN / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(slots * context),
               "-cram", "0", "--no-cache-idle-slots", "-lv", "4"]
        if mmproj:
            cmd += ["--mmproj", str(mmproj)]
        if not repack:
            cmd.append("--no-repack")
        self.cmd = cmd
        self.p = proc_cls(cmd, stdout=subprocess.DEVNULL)
        deadline = time.perf_counter() + timeout
        while True:
            if self.p.p.poll() is not None:
                res = self.p.wait()
                sys.exit(f"compare: llama-server exited {res['rc']} while loading:\n{res['stderr'][-4000:]}")
            try:
                if _request(self.addr, "GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if time.perf_counter() > deadline:
                self.stop()
                sys.exit("compare: llama-server did not come up")
            time.sleep(0.05)
        self.load_s = time.perf_counter() - self.p.t0
        # The server's media marker (random per process unless LLAMA_MEDIA_MARKER pins it): what a prompt_string
        # must hold where the image goes.
        self.media_marker = json.loads(_request(self.addr, "GET", "/props")[1]).get("media_marker", MEDIA_MARKER)

    def tokenize(self, text: str) -> list[int]:
        status, body = _request(self.addr, "POST", "/tokenize", {"content": text, "add_special": False,
                                                                  "parse_special": True})
        if status != 200:
            raise RuntimeError(f"/tokenize: HTTP {status}: {body[:500]!r}")
        return [t if isinstance(t, int) else t["id"] for t in json.loads(body)["tokens"]]

    def complete(self, prompt, new: int) -> dict:
        return completion(self.addr, prompt, new)

    def stop(self) -> dict:
        if self.p.p.poll() is None:
            self.p.p.terminate()
        res = self.p.wait()
        err = res["stderr"]
        # From the load log (-lv 4): the weight buffers (CPU_REPACK when repacked weights are in use), the KV cache's
        # types, flash attention, the CPU features compiled in.
        res["buffers"] = sorted(set(re.findall(r"(\S+) model buffer size", err)))
        res["repack_used"] = any("REPACK" in b for b in res["buffers"])
        m = re.search(r"llama_kv_cache: size = .*?K \((\w+)\).*?V \((\w+)\)", err)
        res["kv_types"] = list(m.groups()) if m else None
        res["flash_attn"] = "Flash Attention enabled" in err if "Flash Attention" in err else None
        m = re.search(r"system_info: (.*)", err)
        res["system_info"] = m.group(1).strip() if m else None
        return res


def _request(addr: str, method: str, path: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def completion(addr: str, prompt, new: int, timeout: float = 1800) -> dict:
    """One streamed /completion: greedy (top-k 1), EOS ignored, `new` tokens, the prompt cache off; the arrival
    time of each token (a chunk's tokens_predicted counts them), the server's timings and prompt rows."""
    body = {"prompt": prompt, "n_predict": new, "stream": True, "cache_prompt": False, "ignore_eos": True,
            "temperature": 0.0, "top_k": 1, "samplers": ["top_k"], "return_tokens": True}
    t0, stamps, tokens, seen, last = time.perf_counter(), [], [], 0, {}
    for t0, chunk in sse.post_stream(addr, "/completion", body, timeout):
        now = time.perf_counter()
        n = chunk.get("tokens_predicted", seen)
        if n > seen and not chunk.get("stop"):
            stamps.extend([now] * (n - seen))
            tokens.extend(chunk.get("tokens") or [])
            seen = n
        if chunk.get("stop"):
            last = chunk
            if n > seen:  # a final chunk carrying tokens of its own
                stamps.extend([now] * (n - seen))
                seen = n
            break
    return {"t0": t0, "stamps": stamps, "tokens": tokens, "rows": last.get("tokens_evaluated"),
            "timings": last.get("timings"), "cached": last.get("tokens_cached")}


# ------------------------------------------------------------------------------------------------
# the measurement


def image_prompt(w) -> tuple[str, str]:
    """The image request's text before and after the image, by the checkpoint's chat template (the text the
    processor expands the image span of)."""
    text = w.tok.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                    {"type": "text", "text": w.prompt}]}],
                                     add_generation_prompt=True, tokenize=False)
    if text.count(IMAGE_SPAN) != 1:
        raise RuntimeError(f"the chat template's image prompt has no single {IMAGE_SPAN}: {text!r}")
    head, tail = text.split(IMAGE_SPAN)
    return head, tail


def chat_ids(w, content: str) -> list[int]:
    ids = w.tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def run(w, args, proc_cls, window_rate, gguf: Path, mmproj: Path, machine_busy, hz: int) -> dict:
    """One repetition: the 1-slot server (one decode stream over the image prompt), then the S-slot server (warm image
    and same-rows text time to first token, S concurrent streams). See the module docstring."""
    png = base64.b64encode(w.image.read_bytes()).decode()
    head, tail = image_prompt(w)

    def image_req(srv):
        return {"prompt_string": head + srv.media_marker + tail, "multimodal_data": [png]}

    repack = not args.llama_no_repack
    new = args.new

    srv = Server(proc_cls, gguf, mmproj, 1, args.capacity, args.threads, repack)
    try:
        head_ids, tail_ids = srv.tokenize(head), srv.tokenize(tail)
        r = srv.complete(image_req(srv), new)
    except BaseException:
        srv.stop()
        raise
    one = srv.stop()
    if len(r["stamps"]) != new:
        raise RuntimeError(f"llama.cpp: the image request yielded {len(r['stamps'])} of {new} tokens")
    out = {"load_s": srv.load_s, "decode_tok_s": (new - 1) / (r["stamps"][-1] - r["stamps"][0]) if new > 1 else None,
           "prompt_rows_image": r["rows"], "head_ids": head_ids, "tail_ids": tail_ids, "tokens": r["tokens"],
           "timings_1_stream": r["timings"], "peak_rss_1_stream_bytes": one["peak_rss_bytes"],
           "cores_used_1_stream": one["cores_used"], "foreign_cores_1_stream": one["foreign_cores"],
           "repack": repack, "repack_used": one["repack_used"], "buffers": one["buffers"], "kv_types": one["kv_types"],
           "flash_attn": one["flash_attn"], "system_info": one["system_info"], "gguf": str(gguf), "mmproj": str(mmproj),
           "server_cmd": " ".join(srv.cmd)}

    rows = r["rows"]
    text_ids = chat_ids(w, w.text_like(rows))
    stream_ids = [chat_ids(w, p) for p in w.stream_prompts]
    srv = Server(proc_cls, gguf, mmproj, args.streams, args.capacity, args.threads, repack)
    try:
        srv.complete(image_req(srv), 1)  # warm-up, as mlxcel-host's server gets
        busy0, t0, cpu0 = machine_busy(), time.perf_counter(), _cpu_s(srv.p.p.pid) + _self_cpu_s()
        r = srv.complete(image_req(srv), 1)
        ttft_image, image_timings = r["stamps"][0] - r["t0"], r["timings"]
        r = srv.complete(text_ids, 1)
        ttft_text, text_timings = r["stamps"][0] - r["t0"], r["timings"]
        results: list[dict | None] = [None] * args.streams

        def one_stream(i):
            results[i] = srv.complete(stream_ids[i], new)

        ts = [threading.Thread(target=one_stream, args=(i,)) for i in range(args.streams)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if any(x is None or len(x["stamps"]) != new for x in results):
            raise RuntimeError(f"llama.cpp: a stream did not yield {new} tokens")
        agg = window_rate(results)
        wall = time.perf_counter() - t0
        # Foreign load over the measured window: the machine's busy time less the server's and this process's.
        own = _cpu_s(srv.p.p.pid) + _self_cpu_s() - cpu0
        foreign = max((machine_busy() - busy0) / hz - own, 0.0) / wall
    except BaseException:
        srv.stop()
        raise
    many = srv.stop()
    out.update(ttft_image_s=ttft_image, ttft_text_same_rows_s=ttft_text, encoder_derived_s=ttft_image - ttft_text,
               text_rows=len(text_ids), timings_image=image_timings, timings_text=text_timings,
               stream_prompt_rows=[len(s) for s in stream_ids], streams=args.streams,
               aggregate_tok_s=agg["aggregate_tok_s"], end_to_end_tok_s=agg["end_to_end_tok_s"],
               peak_rss_bytes=many["peak_rss_bytes"], load_s_streams=srv.load_s,
               foreign_cores=max(one["foreign_cores"], foreign), repack_used=out["repack_used"] or many["repack_used"])
    return out


def _cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def same_prompt(ref: list[int] | None, r: dict) -> bool | None:
    """Whether llama.cpp's image prompt is `ref` (another system's prompt ids): the same text ids before and after the
    image and the same number of rows (the image's own rows are embeddings, not ids)."""
    if not ref or r.get("prompt_rows_image") is None:
        return None
    h, t = r["head_ids"], r["tail_ids"]
    return (r["prompt_rows_image"] == len(ref) and ref[:len(h)] == h and ref[len(ref) - len(t):] == t)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "convert":
        sys.exit(__doc__)
    sys.exit(convert_main(sys.argv[2:]))
