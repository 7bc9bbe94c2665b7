"""Server-sent events over plain HTTP, for the bench scripts: POST a JSON body and read the `data:` chunks."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator


def post_stream(addr: str, path: str, body: dict, timeout: float = 1800) -> Iterator[tuple[float, dict]]:
    """POST `body` to http://addr/path and yield (the request's start, each decoded chunk) until `[DONE]` or the
    stream's end; an HTTP error or a chunk carrying "error" raises."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        t0 = time.perf_counter()
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {resp.read()[:2000]!r}")
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            yield t0, chunk
    finally:
        conn.close()
