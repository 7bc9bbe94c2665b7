#!/usr/bin/env python3
"""Soak: thousands of mixed requests against one `mlxcel-host serve` process at loopback, with random
cancellations and bad requests among them, then whether the server came back to where it started.

Run after building the host and plugins (`cargo build --release -p mlxcel-host`, tools/build-plugins.sh), with
any python3 (standard library only):

    python3 tools/bench/soak.py                       # 2000 requests on the tiny Qwen2-VL fixture, 8 at a time
    python3 tools/bench/soak.py --requests 20000 --concurrency 16 --model DIR --plugins DIR
    python3 tools/bench/soak.py --requests 5000 --rounds 8    # resident memory after each round: leak or not

Each request is drawn (seeded) from: text or image (the fixture's PNG, JPEG, WebP and EXIF-rotated JPEG inputs),
whole or streamed, greedy or sampled, max_tokens 1 to 48, some with a JSON schema to follow or a logit bias, some
on /v1/completions. About one in six is cancelled by the client: a stream closed after a few chunks, or a whole
request whose connection is dropped before the answer. About one in twenty is bad on purpose (an image that is not
an image, an unknown field, an empty prompt) and must be a 400.

First a warm-up of --warmup requests; once the server is idle (no request open, no slot held, nothing queued),
/metrics is read: the start. Then the soak; once idle again, /metrics again: the end. Reported: requests by outcome
(answered, cancelled by the client, refused as expected, and every other error by HTTP status and code), latency
p50/p99 of the answered ones, requests per second, and at start and end: running requests, held slots, queue depth,
KV rows in use, open requests, media bytes held, overdue preparations, encoder-cache bytes and the process's
resident memory (after each round too, with --rounds).

Exit status: non-zero when any request failed unexpectedly (a 5xx, a connection error, a 400 for a good request,
an answer for a bad one) or the server did not come back to idle with no slot, row or request held. The resident
memory's change is reported, not judged (allocators keep freed pages). Results as JSON under
~/.cache/mlxcel/bench/results/soak-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import base64
import collections
import concurrent.futures
import datetime
import http.client
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".webp": "image/webp"}
SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "n": {"type": "integer", "minimum": 0,
          "maximum": 9}}, "required": ["kind", "n"], "additionalProperties": False}


def start_server(args):
    command = [str(args.binary), "serve", "--model", str(args.model), "--plugins", str(args.plugins), "--port", "0",
               "--slots", str(args.slots), "--context", str(args.context), "--chunk", str(args.chunk)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in server.stdout:
        if line.startswith("listening on "):
            address = line.split("listening on ", 1)[1].strip().removeprefix("http://")
            threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            host, port = address.rsplit(":", 1)
            return server, host, int(port), command
    raise SystemExit("the server ended before listening: " + server.stderr.read())


def metrics(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(mlxcel_[a-z_]+)(\{[^}]*\})?\s+([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


IDLE = ["mlxcel_requests_open", "mlxcel_active_slots", "mlxcel_queue_depth", "mlxcel_kv_cache_usage",
        "mlxcel_media_bytes_held", "mlxcel_preparations_overdue"]


def wait_idle(host, port, timeout=60.0):
    deadline = time.time() + timeout
    while True:
        m = metrics(host, port)
        if all(m.get(k, 0) == 0 for k in IDLE) or time.time() > deadline:
            return m
        time.sleep(0.1)


def draw(rng, images, model):
    """One request: (path, body, stream, cancel, expect_ok)."""
    roll = rng.random()
    text = rng.choice(["Describe it.", "What is this?", "Say something short.", "Count to three."])
    body = {"model": model, "max_tokens": rng.randint(1, 48)}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body.update(temperature=rng.choice([0.5, 1.0]), top_p=0.9, seed=rng.randint(0, 1 << 30))
    if roll < 0.05:
        bad = rng.choice(["image", "field", "empty"])
        if bad == "image":
            part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"not an image").decode()}}
            body["messages"] = [{"role": "user", "content": [part, {"type": "text", "text": text}]}]
        elif bad == "field":
            body.update(messages=[{"role": "user", "content": text}], frobnicate=True)
        else:
            body["messages"] = []
        return "/v1/chat/completions", body, False, None, False
    if roll < 0.15:
        body["prompt"] = text
        stream = rng.random() < 0.5
        body["stream"] = stream
        return "/v1/completions", body, stream, cancel_of(rng, stream), True
    content = text
    if rng.random() < 0.5:
        url = rng.choice(images)
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    body["messages"] = [{"role": "user", "content": content}]
    if rng.random() < 0.1:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
        body["max_tokens"] = 64
    elif rng.random() < 0.1:
        body["logit_bias"] = {str(rng.randint(0, 300)): rng.choice([-100, 5])}
    stream = rng.random() < 0.5
    body["stream"] = stream
    return "/v1/chat/completions", body, stream, cancel_of(rng, stream), True


def cancel_of(rng, stream):
    """None, or when the client gives up: after k chunks of a stream, or after s seconds of a whole request."""
    if rng.random() >= 1 / 6:
        return None
    return ("chunks", rng.randint(1, 4)) if stream else ("seconds", rng.choice([0.001, 0.01, 0.05]))


def send(host, port, request):
    path, body, stream, cancel, expect_ok = request
    started = time.perf_counter()
    timeout = cancel[1] if cancel and cancel[0] == "seconds" else 120
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            data = json.loads(response.read() or b"{}")
            code = (data.get("error") or {}).get("code")
            kind = "refused_as_expected" if (not expect_ok and response.status == 400) else f"http_{response.status}_{code}"
            return kind, time.perf_counter() - started
        if not stream:
            data = json.loads(response.read())
            if not expect_ok:
                return "answered_a_bad_request", time.perf_counter() - started
            if body.get("response_format") and data["choices"][0]["finish_reason"] == "stop":
                json.loads(data["choices"][0]["message"]["content"])
            return "answered", time.perf_counter() - started
        chunks = 0
        for line in response:
            if not line.startswith(b"data: "):
                continue
            if line.strip() == b"data: [DONE]":
                return "answered", time.perf_counter() - started
            if b'"error"' in line:
                return "stream_error", time.perf_counter() - started
            chunks += 1
            if cancel and chunks >= cancel[1]:
                return "cancelled", time.perf_counter() - started
        return "stream_cut", time.perf_counter() - started
    except (TimeoutError, OSError) as e:
        if cancel and cancel[0] == "seconds":
            return "cancelled", time.perf_counter() - started
        return f"connection_{type(e).__name__}", time.perf_counter() - started
    finally:
        conn.close()


def run(host, port, requests, concurrency):
    outcomes = collections.Counter()
    latencies = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        for kind, seconds in pool.map(lambda r: send(host, port, r), requests):
            outcomes[kind] += 1
            if kind == "answered":
                latencies.append(seconds)
    return outcomes, latencies


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "tests/fixtures/qwen2_vl")
    parser.add_argument("--plugins", type=Path, default=ROOT / "target/plugins")
    parser.add_argument("--binary", type=Path, default=ROOT / "target/release/mlxcel-host")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="soak this many times against the one server, reading the idle state after each: memory "
                             "that leaks grows every round, memory an allocator keeps stops growing")
    args = parser.parse_args()

    inputs = sorted(p for p in (args.model / "inputs").glob("*") if p.suffix in IMAGES)
    images = [f"data:{IMAGES[p.suffix]};base64," + base64.b64encode(p.read_bytes()).decode() for p in inputs]
    if not images:
        raise SystemExit(f"no images under {args.model / 'inputs'}")
    server, host, port, command = start_server(args)
    model = args.model.resolve().name
    rng = random.Random(args.seed)
    try:
        run(host, port, [draw(rng, images, model) for _ in range(args.warmup)], args.concurrency)
        start = wait_idle(host, port)
        outcomes, latencies, seconds, rounds = collections.Counter(), [], 0.0, []
        for _ in range(args.rounds):
            soak = [draw(rng, images, model) for _ in range(args.requests)]
            began = time.perf_counter()
            round_outcomes, round_latencies = run(host, port, soak, args.concurrency)
            seconds += time.perf_counter() - began
            outcomes.update(round_outcomes)
            latencies += round_latencies
            end = wait_idle(host, port)
            rounds.append(end.get("mlxcel_process_resident_bytes"))
        alive = server.poll() is None
    finally:
        server.terminate()
        server.wait(timeout=60)

    keys = IDLE + ["mlxcel_kv_cache_usage", "mlxcel_encoder_cache_bytes", "mlxcel_process_resident_bytes"]
    state = {k: {"start": start.get(k), "end": end.get(k)} for k in dict.fromkeys(keys)}
    expected = {"answered", "cancelled", "refused_as_expected"}
    unexpected = {k: v for k, v in outcomes.items() if k not in expected}
    latencies.sort()
    pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None
    report = {
        "requests": args.requests * args.rounds, "rounds": args.rounds, "concurrency": args.concurrency,
        "seconds": seconds, "requests_per_second": args.requests * args.rounds / seconds,
        "resident_bytes_after_each_round": rounds, "outcomes": dict(outcomes), "unexpected": unexpected,
        "latency_seconds": {"p50": pct(0.5), "p99": pct(0.99), "mean": statistics.fmean(latencies) if latencies else None},
        "server": state, "server_alive_at_end": alive,
        "resident_growth_bytes": (end.get("mlxcel_process_resident_bytes", 0) - start.get("mlxcel_process_resident_bytes", 0)),
        "command": command, "seed": args.seed,
        "git": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    out = Path.home() / ".cache/mlxcel/bench/results" / f"soak-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ["requests", "seconds", "requests_per_second", "outcomes", "unexpected",
                                             "latency_seconds", "server", "resident_growth_bytes",
                                             "resident_bytes_after_each_round"]}, indent=1))
    print(f"results: {out}", file=sys.stderr)
    leaked = [k for k in IDLE if end.get(k, 0) != 0]
    if unexpected or leaked or not alive:
        print(f"FAILED: unexpected outcomes {unexpected}, not idle at the end: {leaked}, alive: {alive}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
