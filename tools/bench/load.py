#!/usr/bin/env python3
"""A bounded load run against a running `mlxcel-host serve` (or any OpenAI-compatible server).

Sends --requests chat completions, at most --concurrency at a time, each streamed so that time
to first token is seen, and prints throughput and latency percentiles (one JSON object with
--json). A benchmark, not a test: it asserts nothing about speed.

    tools/run.sh serve --model tests/fixtures/qwen2_vl --allow-unqualified --slots 8 --port 8000 &
    .venv/bin/python tools/bench/load.py --base-url http://127.0.0.1:8000/v1 --requests 64 \\
        --concurrency 8 --image tests/fixtures/qwen2_vl/inputs/wide.png --image-every 2
"""

import argparse
import base64
import concurrent.futures
import json
import statistics
import sys
import time
from pathlib import Path

import openai


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="default: the server's only model")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt", default="Write a short story about a lighthouse.")
    parser.add_argument("--image", type=Path, help="a png sent with some requests")
    parser.add_argument("--image-every", type=int, default=2, help="every n-th request carries the image")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    model = args.model or client.models.list().data[0].id
    image_url = None
    if args.image:
        image_url = "data:image/png;base64," + base64.b64encode(args.image.read_bytes()).decode()

    def one(i):
        content = f"{args.prompt} ({i})"
        if image_url and i % args.image_every == 0:
            content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": content}]
        started = time.perf_counter()
        first, tokens, status = None, 0, "ok"
        try:
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": content}],
                max_tokens=args.max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                elif first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - started
        except openai.RateLimitError:
            status = "429"
        except openai.APIError as e:
            status = f"error: {e}"
        return {"latency": time.perf_counter() - started, "ttft": first, "tokens": tokens, "status": status}

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        results = list(pool.map(one, range(args.requests)))
    wall = time.perf_counter() - started

    ok = [r for r in results if r["status"] == "ok"]
    latencies = [r["latency"] for r in ok]
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    tokens = sum(r["tokens"] for r in ok)
    report = {
        "model": model,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "image_every": args.image_every if image_url else None,
        "completed": len(ok),
        "refused_429": sum(r["status"] == "429" for r in results),
        "errors": [r["status"] for r in results if r["status"] not in ("ok", "429")],
        "wall_s": wall,
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": tokens / wall,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "latency_mean_s": statistics.fmean(latencies) if latencies else None,
    }
    if args.json:
        json.dump(report, sys.stdout)
        print()
    else:
        for key, value in report.items():
            if isinstance(value, float):
                value = f"{value:.4f}"
            print(f"{key:>20}: {value}")
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
