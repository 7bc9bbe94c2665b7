#!/usr/bin/env python3
"""Two or more builds of mlxcel-host side by side on warm servers: the time to first token of the same image
request and text prompt against each, alternating (the order reversed every repetition), with medians. Decode
rates are `streams.py`'s and `compare.py`'s: timed from this client's chunk arrivals over a few tokens, they came
out above the machine's bandwidth limit.

    ab_serve.py --reps 4 before=/tmp/old-host:/tmp/old-plugins after=target/release/mlxcel-host:target/plugins

Each server gets one slot, no encoder or prefix cache (so every request runs the encoder and the whole prompt)
and its warm-up request before any is timed. A build is NAME=HOST:PLUGINS; each runs with the same --model,
--context and --compute.
"""
import argparse
import base64
import json
import re
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import compare
import gen_ckpt

TEXT = ("Write a long story about a lighthouse keeper who finds a message in a bottle, the storm that follows, the "
        "ship that nearly founders on the rocks, the village that gathers on the shore, the old songs they sing, the "
        "letters that cross the sea for years afterwards, and what the keeper finally learns about the sender. ") * 2


def start(host: str, plugins: str, args) -> tuple[subprocess.Popen, str, str]:
    cmd = [host, "serve", "--model", str(args.model), "--port", "0", "--slots", "1", "--context", str(args.context),
           "--plugins", plugins, "--encoder-cache-mb", "0", "--no-prefix-cache",
           *(("--compute", "bf16", "--allow-unqualified") if args.compute == "bf16" else ())]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in server.stdout:
        if m := re.match(r"listening on http://(\S+)", line):
            addr = m.group(1)
            break
    else:
        sys.exit(f"ab_serve: {host} did not start")
    threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()
    model = json.loads(compare._get(addr, "/v1/models"))["data"][0]["id"]
    return server, addr, model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="NAME=HOST:PLUGINS")
    ap.add_argument("--model", type=Path, default=gen_ckpt.BENCH_DIR / "qwen2vl-2b-bf16-L28-V32")
    ap.add_argument("--image", type=Path, default=gen_ckpt.BENCH_DIR / "inputs" / "synthetic-448.png")
    ap.add_argument("--compute", choices=("f32", "bf16"), default="bf16")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()

    url = "data:image/png;base64," + base64.b64encode(args.image.read_bytes()).decode()
    image = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": compare.PROMPT}]
    servers = []
    try:
        for spec in args.builds:
            name, _, rest = spec.partition("=")
            host, _, plugins = rest.partition(":")
            servers.append((name, *start(host, plugins, args)))
        figures = {what: {s[0]: [] for s in servers} for what in ("image ttft (s)", "text ttft (s)")}
        for _, _, addr, model in servers:
            compare.sse_request(addr, compare.chat_body(model, image, 1))
        for rep in range(args.reps):
            for name, _, addr, model in servers if rep % 2 == 0 else servers[::-1]:
                r = compare.sse_request(addr, compare.chat_body(model, image, 1))
                figures["image ttft (s)"][name].append(r["stamps"][0] - r["t0"])
                r = compare.sse_request(addr, compare.chat_body(model, TEXT, 1))
                figures["text ttft (s)"][name].append(r["stamps"][0] - r["t0"])
    finally:
        for _, server, _, _ in servers:
            server.terminate()
            server.wait()
    for what, runs in figures.items():
        for name, values in runs.items():
            print(f"{what:15} {name:10} median {statistics.median(values):7.3f}   " +
                  " ".join(f"{v:.2f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
