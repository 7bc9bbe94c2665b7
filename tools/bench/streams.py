#!/usr/bin/env python3
"""Aggregate decode rate of N concurrent streams on one `mlxcel-host serve`, for comparing two builds.

Starts the given host binary with N slots on a checkpoint, warms it up, sends N chat requests at once (the
stories of compare.py's stream prompt, --new tokens each) and prints the tokens per second over the span every
stream was decoding, and the cores the server used in the middle of that span. Run it alternately with two
binaries (A B A B) to compare builds on the same machine; `outputs` is a digest of every stream's tokens and
logprobs, the same for two builds that compute the same bits:

    $PY tools/bench/streams.py --host /tmp/host-a --plugins /tmp/plugins-a --model ~/.cache/mlxcel/bench/qwen2vl-2b-bf16-L28-V32 -- --compute bf16 --allow-unqualified

Arguments after `--` go to `serve`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare  # noqa: E402  (the HTTP client and the host paths)


def server_cores(pid: int) -> float:
    """CPU seconds the process has used (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", type=Path, default=compare.HOST, help="the mlxcel-host binary")
    ap.add_argument("--plugins", type=Path, default=compare.PLUGINS, help="the family plugins built with that binary")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--new", type=int, default=400, help="tokens per stream")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("serve_args", nargs="*", help="after --: more arguments for serve")
    args = ap.parse_args()

    cmd = [str(args.host), "serve", "--model", str(args.model), "--port", "0", "--slots", str(args.streams),
           "--context", str(args.context), "--chunk", str(args.chunk), "--plugins", str(args.plugins),
           *args.serve_args]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = None
    for line in server.stdout:
        if m := re.match(r"listening on http://(\S+)", line):
            addr = m.group(1)
            break
    if addr is None:
        sys.exit("streams: the server did not start")
    threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()
    try:
        model = json.loads(compare._get(addr, "/v1/models"))["data"][0]["id"]
        compare.sse_request(addr, compare.chat_body(model, "hi", 4))  # warm-up: the bundle loaded

        def one(i):
            return compare.sse_request(addr, compare.chat_body(model, compare.STREAM_PROMPT.format(i + 1), args.new))

        with ThreadPoolExecutor(args.streams) as pool:
            started = time.time()
            futures = [pool.submit(one, i) for i in range(args.streams)]
            # Cores used over 10 s from 5 s in (the prompts, a few dozen rows each, are prefilled by then).
            time.sleep(max(0.0, started + 5 - time.time()))
            c0, t0 = server_cores(server.pid), time.time()
            time.sleep(10)
            cores = (server_cores(server.pid) - c0) / (time.time() - t0)
            results = [f.result() for f in futures]
        start = max(r["stamps"][0] for r in results)
        end = min(r["stamps"][-1] for r in results)
        steps = sum(sum(1 for t in r["stamps"] if start <= t <= end) for r in results)
        rate = steps / (end - start) if end > start else float("nan")
        # Two builds that compute the same bits print the same digest of every stream's tokens and logprobs.
        outputs = hashlib.sha256(json.dumps([r["tokens"] for r in results]).encode()).hexdigest()[:16]
        print(json.dumps({"host": str(args.host), "streams": args.streams, "decode_tok_s": round(rate, 2),
                          "span_s": round(end - start, 1), "server_cores": round(cores, 2), "outputs": outputs}))
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
