#!/usr/bin/env python3
"""Serving under load: whether an image request freezes the text streams a server is already decoding, and what
the encoder and prefix caches save on the second turn of a conversation about an image, measured against real
`mlxcel-host serve` processes over HTTP.

Run with the oracle venv's python (Pillow, numpy; no other client library), after building the host and plugins
(`cargo build --release -p mlxcel-host` and tools/build-plugins.sh):

    PY=~/.cache/mlxcel/oracle-venv/bin/python
    $PY tools/bench/serving.py --quick       # the tiny Qwen2-VL fixture: a smoke run, its ratios mean little
    $PY tools/bench/serving.py               # the shape-real Qwen2-VL-2B that gen_ckpt.py makes (--dtype)
    $PY tools/bench/serving.py --model DIR --slots 8 --context 2048 --chunk 64 --streams 4 --image-size 448

Two phases, each on a server process of its own so that neither sees the other's caches:

  freeze        `serve --encoder-cache-mb 0 --no-prefix-cache`, so every image request is decoded, preprocessed,
                encoded and prefilled in full, however often it is sent. One image request with another picture
                of the same size loads the encoder; then the measured image request's time to first token is
                taken alone (--reps times, the median). Then --streams text streams decode (streamed, temperature
                0, ignore_eos, max_tokens as much as the context holds); once each has decoded for --image-after
                seconds (and 8 tokens), the same image request is sent. The streams go on until it has ended and
                then as long as they ran before it; then the client closes them, which cancels them in the server.
                Every token comes in a chunk of its own (logprobs are asked for, as compare.py does), so the gaps
                between consecutive chunks of a stream, taken with perf_counter as they arrive, are its
                inter-token gaps; they count from the last stream's first token on, when every stream decodes, so
                that the streams' own prompt prefills are not taken for a freeze. Targets: the worst gap at most 3x
                the median gap (all streams' gaps together); the image's time to first token under load at most
                1.25x its time alone.
  conversation  `serve` with its default caches. After one image request (another picture) loads the encoder,
                --reps two-turn conversations, each about a picture no request has sent before: turn 1 is the
                picture and a question; turn 2 sends the same picture bytes again with turn 1's answer and one more
                question. Target: turn 2's time to first token at least 5x shorter than turn 1's (medians); turn
                2's usage.prompt_tokens_details.cached_tokens says how much of its prompt the prefix cache held.

Pictures are seeded noise PNGs of --image-size pixels square: one size, so one encoder shape and one cost, and
bytes no cache has seen unless the measurement means it to. Times to first token run from sending the request to
its first content chunk. /metrics is read at the end of each phase (the freeze phase's must show no encoder-cache
hit and no reused prefix row, or its caches were not off).

Results: a table on stdout (metric, figure, target, met) and the raw figures as JSON under
~/.cache/mlxcel/bench/results/serving-<timestamp>.json: every stream's gap summary and gap list, the times to
first token, /metrics, the server command lines and their peak RSS, git HEAD, the date and the machine. A
benchmark: it asserts nothing about the figures; it exits non-zero only when a measurement could not be made.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (tools/bench, on the path above)
import gen_ckpt  # noqa: E402

REPO = compare.REPO
FAMILY = "qwen2_vl"
IMAGE_PROMPT = "Describe this image."
FOLLOW_UP = "Which colour is there most of? Answer in one sentence."
# SIGTERM makes the server drain its in-flight requests (for up to its --shutdown-timeout, 30 s), but the client has
# closed every stream by then: a server still running this long after it hangs, and is killed.
KILL_AFTER_S = 15
# What --quick and a full run default to where a flag is not given. The fixture's context is 256 rows, which its
# chunk must divide; a 56-pixel picture leaves the streams most of it.
DEFAULTS = {
    False: {"slots": 8, "context": 2048, "chunk": compare.CHUNK[FAMILY], "image_size": 448, "image_after": 2.0,
            "image_tokens": 16, "answer_tokens": 32, "reps": 3, "timeout": 1800.0},
    True: {"slots": 8, "context": 256, "chunk": compare.QUICK_CHUNK[FAMILY], "image_size": 56, "image_after": 0.05,
           "image_tokens": 4, "answer_tokens": 8, "reps": 2, "timeout": 60.0},
}
# Tokens every stream must have decoded, beyond the seconds, before the image is sent and before the streams are
# closed after it: on a fast model a few milliseconds hold too few gaps to see anything in.
MIN_TOKENS = 8


def say(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# the server


class ServerError(RuntimeError):
    pass


class Server:
    """One `mlxcel-host serve` on a free port (compare.Proc: stderr kept, peak RSS from wait4), ended when the
    `with` block is left however it is left: Ctrl-C, an exception or SIGTERM to this script (see main)."""

    def __init__(self, model: Path, args, *extra: str):
        self.cmd = compare.host_cmd("serve", "--model", str(model), "--plugins", str(compare.PLUGINS),
                                    "--slots", str(args.slots), "--context", str(args.context),
                                    "--chunk", str(args.chunk), "--port", "0",
                                    "--prefill-chunks-per-step", str(args.prefill_chunks_per_step), *extra)
        self.start_timeout = args.start_timeout
        self.proc: compare.Proc | None = None
        self.addr: str | None = None
        self.load_s: float | None = None
        self.result: dict | None = None

    def __enter__(self) -> Server:
        say("starting: " + " ".join(self.cmd))
        self.proc = compare.Proc(self.cmd)
        listening = threading.Event()

        def read_stdout():
            # The address is announced on stdout once the model is loaded; the rest of stdout must still be read
            # or a full pipe would block the server.
            for line in self.proc.p.stdout:
                m = re.match(r"listening on http://(\S+)", line)
                if m and not listening.is_set():
                    self.addr = m.group(1)
                    listening.set()

        threading.Thread(target=read_stdout, daemon=True).start()
        while not listening.wait(0.2):
            # waitid with WNOWAIT sees an exit without reaping it, which Proc.wait's wait4 must do.
            if os.waitid(os.P_PID, self.proc.p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                self.stop()
                raise ServerError(f"the server exited while starting (exit {self.result['rc']}); its stderr, last "
                                  f"lines:\n{self.stderr_tail()}")
            if time.perf_counter() - self.proc.t0 > self.start_timeout:
                self.stop()
                raise ServerError(f"the server did not listen within {self.start_timeout:.0f} s; its stderr, last "
                                  f"lines:\n{self.stderr_tail()}")
        self.load_s = time.perf_counter() - self.proc.t0
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.stop()
        if kind is not None and issubclass(kind, Exception):
            say(f"the server's stderr, last lines:\n{self.stderr_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.result is not None:
            return
        # os.kill, not Popen's send_signal: that polls first, and a poll that reaps the exit leaves Proc.wait's
        # wait4 nothing to wait for. The pid stays ours until wait4 reaps it.
        pid = self.proc.p.pid
        os.kill(pid, signal.SIGTERM)
        killer = threading.Timer(KILL_AFTER_S, os.kill, (pid, signal.SIGKILL))
        killer.start()
        try:
            self.result = self.proc.wait()
        finally:
            killer.cancel()

    def stderr_tail(self, chars: int = 4000) -> str:
        if self.result is not None:
            return self.result["stderr"][-chars:]
        self.proc.err.seek(0)
        return self.proc.err.read().decode(errors="replace")[-chars:]

    def report(self) -> dict:
        r = self.result or {}
        return {"command": " ".join(self.cmd), "listening_after_s": self.load_s, "exit": r.get("rc"),
                "wall_s": r.get("wall_s"), "peak_rss_bytes": r.get("peak_rss_bytes"), "cpu_s": r.get("cpu_s"),
                "foreign_cores": r.get("foreign_cores")}


def served_model(addr: str) -> str:
    return json.loads(compare._get(addr, "/v1/models"))["data"][0]["id"]


def scrape_metrics(addr: str) -> dict[str, float]:
    """The server's mlxcel_* samples by name and labels; histogram buckets left out (their sums and counts kept)."""
    samples = {}
    for line in compare._get(addr, "/metrics").splitlines():
        if line.startswith("mlxcel_") and "_bucket{" not in line:
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


# ------------------------------------------------------------------------------------------------
# requests


def sse_payloads(resp):
    """The JSON payloads of a server-sent event stream, up to its [DONE]."""
    for raw in resp:
        field, _, value = raw.decode().partition(":")
        if field == "data":
            value = value.strip()
            if value == "[DONE]":
                return
            yield json.loads(value)


def stream_chat(addr: str, body: dict, timeout: float, rec: dict | None = None,
                stop: threading.Event | None = None) -> dict:
    """One streamed chat completion into `rec` (filled as chunks come, so another thread can watch it): the send
    time, each chunk's arrival, the text, usage and finish reason. Once `stop` is set the connection is closed at
    the next chunk, which cancels the request in the server. `timeout` bounds every wait for the server."""
    rec = new_record() if rec is None else rec
    payload = json.dumps(body)
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        rec["t0"] = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:2000].decode(errors='replace')}")
        for chunk in sse_payloads(resp):
            now = time.perf_counter()
            if "error" in chunk:
                raise RuntimeError(f"the server ended the stream: {chunk['error']}")
            rec["usage"] = chunk.get("usage") or rec["usage"]
            for choice in chunk.get("choices", []):
                rec["finish"] = choice.get("finish_reason") or rec["finish"]
                if choice.get("logprobs") or choice.get("delta", {}).get("content"):
                    rec["stamps"].append(now)
                    rec["text"].append(choice.get("delta", {}).get("content") or "")
            if stop is not None and stop.is_set():
                rec["finish"] = "closed by the client"
                break
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        conn.close()
        rec["done"] = True
    return rec


def new_record() -> dict:
    return {"t0": None, "stamps": [], "text": [], "usage": None, "finish": None, "error": None, "done": False}


def ttft(rec: dict) -> float:
    if not rec["stamps"]:
        raise RuntimeError(f"a request ended without a token ({rec['finish']}, {rec['error']})")
    return rec["stamps"][0] - rec["t0"]


def cached_tokens(rec: dict) -> int | None:
    return ((rec["usage"] or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


def noise_png_url(seed: int, size: int) -> str:
    """A seeded noise picture as a data URL: each seed is bytes no cache has seen; every one is the same size, so
    the same encoder shape and work."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_message(url: str, text: str = IMAGE_PROMPT) -> dict:
    return {"role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}


def chat(model: str, messages: list[dict], max_tokens: int) -> dict:
    # compare.chat_body's streamed, greedy, ignore_eos, logprobs request, with a whole conversation.
    return {**compare.chat_body(model, None, max_tokens), "messages": messages}


class Seeds:
    """Picture seeds, a new one per use."""

    def __init__(self, base: int):
        self.next_seed = base

    def __call__(self) -> int:
        self.next_seed += 1
        return self.next_seed


# ------------------------------------------------------------------------------------------------
# phase 1: an image request among decoding streams


def wait_for(recs: list[dict], seconds: float, tokens: int, deadline_s: float) -> None:
    """Until `seconds` have passed and every stream has `tokens` more chunks than now, or a stream has ended."""
    t0, had = time.perf_counter(), [len(r["stamps"]) for r in recs]
    while True:
        if any(r["done"] for r in recs):
            return
        if time.perf_counter() - t0 >= seconds and all(len(r["stamps"]) - n >= tokens for r, n in zip(recs, had)):
            return
        if time.perf_counter() - t0 > deadline_s:
            raise RuntimeError(f"the streams did not reach {tokens} more tokens each within {deadline_s:.0f} s")
        time.sleep(0.005)


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"n": len(values), "min": min(values), "median": statistics.median(values), "mean": statistics.fmean(values),
            "p90": q[89], "p99": q[98], "max": max(values)}


def gap_report(streams: list[dict], image: dict) -> dict:
    """Inter-token gaps of every stream from the moment all of them decode (the last stream's first token) on:
    all of them, those that ended before the image request was sent, and those that overlap its way to its first
    token (where a freeze shows), with where each stream's worst gap fell (times from the image request's send)."""
    everyone = max(r["stamps"][0] for r in streams)
    sent, first = image["t0"], image["stamps"][0] if image["stamps"] else None
    per_stream, pooled, before, during = [], [], [], []
    for r in streams:
        t = [s for s in r["stamps"] if s >= everyone]
        spans = list(zip(t, t[1:]))
        gaps = [b - a for a, b in spans]
        ahead = [b - a for a, b in spans if b <= sent]
        hit = [b - a for a, b in spans if first is not None and a < first and b > sent]
        pooled, before, during = pooled + gaps, before + ahead, during + hit
        worst = max(range(len(gaps)), key=gaps.__getitem__) if gaps else None
        per_stream.append({
            **summary(gaps), "tokens": len(r["stamps"]), "finish": r["finish"],
            "worst_from_s": spans[worst][0] - sent if worst is not None else None,
            "worst_to_s": spans[worst][1] - sent if worst is not None else None,
            "before_image": summary(ahead), "during_image_prefill": summary(hit),
            "running_after_image_first_token": first is not None and r["stamps"][-1] > first,
            "gaps_s": [round(g, 6) for g in gaps],
        })
    median = statistics.median(pooled) if pooled else None
    worst = max(pooled) if pooled else None
    return {"streams": per_stream, "median_gap_s": median, "worst_gap_s": worst,
            "worst_over_median": worst / median if median and worst is not None else None,
            "median_gap_before_image_s": statistics.median(before) if before else None,
            "worst_gap_during_image_prefill_s": max(during) if during else None,
            "all_running_through_image": all(s["running_after_image_first_token"] for s in per_stream)}


def freeze_phase(model_dir: Path, args, seeds: Seeds) -> dict:
    with Server(model_dir, args, "--encoder-cache-mb", "0", "--no-prefix-cache") as srv:
        model = served_model(srv.addr)
        say("freeze: warm-up (the prompts' lengths, the encoder) ...")
        prompts = [compare.STREAM_PROMPT.format(i + 1) for i in range(args.streams)]
        texts = [[{"role": "user", "content": p}] for p in prompts]
        # A stream may ask for as many tokens as its slot has rows left; the probe also warms the text path.
        budgets = [args.context - stream_chat(srv.addr, chat(model, m, 1), args.timeout)["usage"]["prompt_tokens"]
                   for m in texts]

        def image_request(seed: int) -> dict:
            return chat(model, [image_message(noise_png_url(seed, args.image_size))], args.image_tokens)

        warm = stream_chat(srv.addr, image_request(seeds()), args.timeout)
        # The caches are off, so the same bytes are encoded afresh every time: alone and under load, the very same
        # request.
        measured = image_request(seeds())
        say(f"freeze: the image request alone, {args.reps} times ...")
        alone = [stream_chat(srv.addr, measured, args.timeout) for _ in range(args.reps)]

        say(f"freeze: {args.streams} streams, then the image request among them ...")
        stop = threading.Event()
        recs = [new_record() for _ in prompts]
        threads = [threading.Thread(target=_stream_quietly, daemon=True,
                                    args=(srv.addr, chat(model, m, n), args.timeout, rec, stop))
                   for m, n, rec in zip(texts, budgets, recs)]
        for t in threads:
            t.start()
        wait_for(recs, args.image_after, MIN_TOKENS, args.timeout)
        if any(r["done"] for r in recs):
            raise RuntimeError("a stream ended before the image request was sent: "
                               + "; ".join(f"{r['finish']} {r['error'] or ''}" for r in recs if r["done"]))
        loaded = stream_chat(srv.addr, measured, args.timeout)
        # Then as long as they had decoded before it, so that the streams' recovery is seen too.
        wait_for(recs, loaded["t0"] - recs[0]["t0"], MIN_TOKENS, args.timeout)
        stop.set()
        for t in threads:
            t.join(args.timeout)
        errors = [r["error"] for r in recs if r["error"]]
        if errors:
            raise RuntimeError(f"a stream failed: {errors[0]}")
        metrics = scrape_metrics(srv.addr)
    alone_ttft = statistics.median(ttft(r) for r in alone)
    return {
        "server": srv.report(), "model": model, "stream_prompts": prompts, "stream_max_tokens": budgets,
        "image_size": args.image_size, "image_max_tokens": args.image_tokens, "image_after_s": args.image_after,
        "image_prompt_tokens": (warm["usage"] or {}).get("prompt_tokens"), "warmup_image_ttft_s": ttft(warm),
        "image_ttft_alone_s": alone_ttft, "image_ttft_alone_runs_s": [ttft(r) for r in alone],
        "image_ttft_loaded_s": ttft(loaded), "image_loaded_over_alone": ttft(loaded) / alone_ttft,
        "image_sent_after_streams_s": loaded["t0"] - recs[0]["t0"],
        **gap_report(recs, loaded), "metrics": metrics,
        "caches_off": (metrics.get("mlxcel_encoder_cache_hits_total", 0) == 0
                       and metrics.get("mlxcel_prefix_cache_reused_rows_total", 0) == 0),
    }


def _stream_quietly(*a) -> None:
    # A stream's failure is kept in its record and reported by the phase; a traceback from the thread would only
    # repeat it.
    try:
        stream_chat(*a)
    except Exception:
        pass


# ------------------------------------------------------------------------------------------------
# phase 2: a conversation's second turn


def conversation_phase(model_dir: Path, args, seeds: Seeds) -> dict:
    with Server(model_dir, args) as srv:
        model = served_model(srv.addr)
        say("conversation: warm-up (the encoder) ...")
        stream_chat(srv.addr, chat(model, [image_message(noise_png_url(seeds(), args.image_size))],
                                   args.image_tokens), args.timeout)
        runs = []
        for rep in range(args.reps):
            say(f"conversation {rep + 1} of {args.reps} ...")
            turn1_messages = [image_message(noise_png_url(seeds(), args.image_size))]
            turn1 = stream_chat(srv.addr, chat(model, turn1_messages, args.answer_tokens), args.timeout)
            answer = "".join(turn1["text"])
            turn2_messages = turn1_messages + [{"role": "assistant", "content": answer},
                                               {"role": "user", "content": FOLLOW_UP}]
            turn2 = stream_chat(srv.addr, chat(model, turn2_messages, args.answer_tokens), args.timeout)
            runs.append({
                "turn1_ttft_s": ttft(turn1), "turn2_ttft_s": ttft(turn2),
                "turn1_prompt_tokens": (turn1["usage"] or {}).get("prompt_tokens"),
                "turn1_cached_tokens": cached_tokens(turn1),
                "turn2_prompt_tokens": (turn2["usage"] or {}).get("prompt_tokens"),
                "turn2_cached_tokens": cached_tokens(turn2), "answer_chars": len(answer),
            })
        metrics = scrape_metrics(srv.addr)
    t1, t2 = compare.med(runs, "turn1_ttft_s"), compare.med(runs, "turn2_ttft_s")
    return {"server": srv.report(), "model": model, "image_size": args.image_size,
            "answer_tokens": args.answer_tokens, "runs": runs, "turn1_ttft_s": t1, "turn2_ttft_s": t2,
            "turn1_over_turn2": t1 / t2, "turn2_cached_tokens": compare.med(runs, "turn2_cached_tokens"),
            "turn2_prompt_tokens": compare.med(runs, "turn2_prompt_tokens"), "metrics": metrics}


# ------------------------------------------------------------------------------------------------
# the run


def machine() -> dict:
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    per_socket, sockets = fields.get("Core(s) per socket"), fields.get("Socket(s)")
    mem = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    return {"cpu_model": fields.get("Model name"),
            "cores": int(per_socket) * int(sockets) if per_socket and sockets else None,
            "logical_cpus": int(fields["CPU(s)"]) if "CPU(s)" in fields else os.cpu_count(),
            "mem_bytes": int(mem.group(1)) * 1024 if mem else None, "loadavg_at_start": os.getloadavg()}


def git(*a: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()


def table(report: dict) -> list[tuple[str, str, str, str]]:
    """(metric, figure, target, met) rows."""
    f, c, s = report["freeze"], report["conversation"], report["streams"]
    ms = lambda v: compare.fmt(None if v is None else v * 1e3)  # noqa: E731
    met = lambda ok: "n/a" if ok is None else ("yes" if ok else "NO")  # noqa: E731
    # A gap ratio means nothing when some stream had ended before the image's first token (raise --context).
    valid = f["all_running_through_image"]
    ratio = f["worst_over_median"] if valid else None
    rows = [
        (f"inter-token gap, median of {s} streams (ms)", ms(f["median_gap_s"]), "", ""),
        ("  of the gaps before the image request was sent (ms)", ms(f["median_gap_before_image_s"]), "", ""),
        (f"inter-token gap, worst of {s} streams (ms)", ms(f["worst_gap_s"]), "", ""),
        ("  worst of those overlapping the image's way to its first token (ms)",
         ms(f["worst_gap_during_image_prefill_s"]), "", ""),
        ("worst gap / median gap", compare.fmt(f["worst_over_median"]), "<= 3", met(ratio and ratio <= 3)),
        ("image TTFT alone (s)", compare.fmt(f["image_ttft_alone_s"]), "", ""),
        (f"image TTFT with {s} streams decoding (s)", compare.fmt(f["image_ttft_loaded_s"]), "", ""),
        ("image TTFT loaded / alone", compare.fmt(f["image_loaded_over_alone"]), "<= 1.25",
         met(f["image_loaded_over_alone"] <= 1.25)),
        ("conversation turn 1 TTFT (s)", compare.fmt(c["turn1_ttft_s"]), "", ""),
        ("conversation turn 2 TTFT (s)", compare.fmt(c["turn2_ttft_s"]), "", ""),
        ("turn 1 TTFT / turn 2 TTFT", compare.fmt(c["turn1_over_turn2"]), ">= 5", met(c["turn1_over_turn2"] >= 5)),
        ("turn 2 cached_tokens / prompt_tokens", f"{compare.fmt(c['turn2_cached_tokens'])} / "
                                                 f"{compare.fmt(c['turn2_prompt_tokens'])}", "", ""),
    ]
    return rows


def print_report(report: dict, rows: list[tuple]) -> None:
    f, c = report["freeze"], report["conversation"]
    print(f"\nserving under load: {report['model']} ({report['git_head'][:12]}{' dirty' if report['git_dirty'] else ''}"
          f"), {report['machine']['cpu_model']}, {report['machine']['cores']} cores; --slots {report['slots']} "
          f"--context {report['context']} --chunk {report['chunk']}, {report['image_size']}px pictures "
          f"({f['image_prompt_tokens']} prompt rows with the image), {report['reps']} reps\n")
    print("| metric | figure | target | met |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    if not f["all_running_through_image"]:
        print("note: a stream had ended before the image's first token; the gap ratio is not a measurement of a "
              "freeze (raise --context or lower --image-after)")
    if not f["caches_off"]:
        print("note: the freeze phase's server reused cached encoder outputs or prefix rows: its image requests "
              "were not all encoded afresh")
    for name, m in (("freeze", f["metrics"]), ("conversation", c["metrics"])):
        keep = {k.removeprefix("mlxcel_"): v for k, v in m.items()
                if "cache" in k or k.startswith(("mlxcel_prompt_tokens", "mlxcel_requests"))}
        print(f"/metrics after {name}: " + ", ".join(f"{k} {compare.fmt(v)}" for k, v in keep.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"the tiny fixture tests/fixtures/{FAMILY}, small requests: a smoke run")
    ap.add_argument("--model", type=Path, help="a Qwen2-VL checkpoint directory (default: the shape-real Qwen2-VL-2B "
                                               "gen_ckpt.py makes under ~/.cache/mlxcel/bench/)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="the default checkpoint's storage (default %(default)s, as compare.py's)")
    ap.add_argument("--slots", type=int, help="server slots (default 8; at least --streams + 1)")
    ap.add_argument("--context", type=int, help="rows per slot (default 2048; --quick 256)")
    ap.add_argument("--chunk", type=int, help="prefill chunk (default 64; --quick 32)")
    ap.add_argument("--prefill-chunks-per-step", type=int, default=1,
                    help="the server's flag (default 1, its own default); a large value prefills each prompt whole, "
                         "as the server did before prompts were prefilled in pieces")
    ap.add_argument("--streams", type=int, default=4, help="text streams decoding when the image comes (default 4)")
    ap.add_argument("--image-size", type=int, help="picture side in pixels (default 448; --quick 56)")
    ap.add_argument("--image-after", type=float,
                    help="seconds the streams decode before the image request (default 2; --quick 0.05)")
    ap.add_argument("--image-tokens", type=int, help="max_tokens of an image request (default 16; --quick 4)")
    ap.add_argument("--answer-tokens", type=int, help="max_tokens of a conversation turn (default 32; --quick 8)")
    ap.add_argument("--reps", type=int, help="alone image requests and conversations, medians (default 3; "
                                             "--quick 2)")
    ap.add_argument("--timeout", type=float, help="seconds any wait for the server may take (default 1800; "
                                                  "--quick 60)")
    ap.add_argument("--start-timeout", type=float, default=1800,
                    help="seconds a server may take to load and listen (default %(default)s)")
    ap.add_argument("--out", type=Path, help="results JSON (default ~/.cache/mlxcel/bench/results/serving-*.json)")
    args = ap.parse_args()
    for k, v in DEFAULTS[args.quick].items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    for need in (compare.HOST, compare.PLUGINS):
        if not need.exists():
            sys.exit(f"serving: {need} is missing: run `cargo build --release -p mlxcel-host` and "
                     f"tools/build-plugins.sh")
    if args.slots < args.streams + 1:
        sys.exit(f"serving: --slots {args.slots} leaves no free slot for the image request beside {args.streams} "
                 f"streams (it would wait for a slot, not for the encoder)")
    if args.context % args.chunk:
        sys.exit(f"serving: --context {args.context} must be a multiple of --chunk {args.chunk}")
    if args.quick:
        model = args.model or compare.FIXTURES[FAMILY]
    elif args.model:
        model = args.model
    else:
        model = gen_ckpt.default_dir(args.dtype, *gen_ckpt.FULL_DEPTH[FAMILY], FAMILY)
        if not (model / gen_ckpt.DONE).exists():
            print(f"serving: the shape-real Qwen2-VL-2B ({args.dtype}) is not at {model}; make it with\n"
                  f"  {sys.executable} {REPO / 'tools' / 'bench' / 'gen_ckpt.py'} --dtype {args.dtype}",
                  file=sys.stderr)
            return 2
    if not (model / "config.json").exists():
        sys.exit(f"serving: {model} is not a checkpoint directory (no config.json)")

    # SIGTERM to this script unwinds like Ctrl-C, so every server is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = datetime.datetime.now(datetime.timezone.utc)
    seeds = Seeds(int(started.timestamp()) * 1000)
    report = {
        "started": started.strftime("%Y%m%dT%H%M%SZ"),
        "command": " ".join([Path(sys.executable).name, "tools/bench/serving.py", *sys.argv[1:]]),
        "quick": args.quick, "model": str(model), "host_binary": str(compare.HOST),
        "host_binary_mtime": datetime.datetime.fromtimestamp(compare.HOST.stat().st_mtime,
                                                             datetime.timezone.utc).isoformat(),
        "git_head": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": machine(), "slots": args.slots, "context": args.context, "chunk": args.chunk,
        "streams": args.streams, "image_size": args.image_size, "reps": args.reps,
    }
    try:
        report["freeze"] = freeze_phase(model, args, seeds)
        report["conversation"] = conversation_phase(model, args, seeds)
    except (ServerError, RuntimeError, OSError) as e:
        print(f"serving: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("serving: interrupted; the servers are stopped", file=sys.stderr)
        return 130
    rows = table(report)
    report["table"] = [dict(zip(("metric", "figure", "target", "met"), r)) for r in rows]
    report["finished"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    print_report(report, rows)
    out = args.out or gen_ckpt.BENCH_DIR / "results" / f"serving-{report['started']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
