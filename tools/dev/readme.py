#!/usr/bin/env python3
"""Runs every shell command block of README.md, in order, from the repository root.

    python3 tools/dev/readme.py            # every block; fails on the first command that fails
    python3 tools/dev/readme.py --list     # what would run, one command a line, and what is skipped
    python3 tools/dev/readme.py --only 'generate'   # only the commands this regex finds (while editing)

This is how CI keeps the README true (`.ci/run`): each ```sh block is split into commands (a command
ends where bash finds it complete, so a quoted string may span lines) and each runs with `bash -c`
in the repository root. A command whose text carries `# not run by CI: <reason>` is skipped and the
reason printed; nothing else is.

A command that starts a server (`tools/run.sh` with no arguments, or `tools/run.sh serve ...`) is
started in the background; once it prints `listening on http://ADDR`, the `chat:` request it prints
for pasting is run with curl and must answer with a completion. The server keeps running for the
rest of its block, so the block's clients talk to it, and at the end of the block it gets SIGTERM and
must drain and exit 0.

Standard library only: on a new machine this runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = re.compile(r"#\s*not run by CI:\s*(?P<reason>\S.*)$", re.MULTILINE)
SERVER = re.compile(r"^tools/run\.sh(\s+serve\b[^#]*)?\s*(#.*)?$", re.DOTALL)
# Generous: the first command builds the IREE runtime and the host from nothing on 2 cores, and
# tools/test.sh installs the oracle venv and runs the whole suite.
COMMAND_TIMEOUT = 75 * 60
STOP_TIMEOUT = 90


@dataclass
class Command:
    block: int
    line: int
    text: str

    @property
    def skip_reason(self) -> str | None:
        m = SKIP.search(self.text)
        return m.group("reason").strip() if m else None

    @property
    def is_server(self) -> bool:
        return SERVER.match(self.text.strip()) is not None


def blocks(readme: Path) -> list[list[Command]]:
    """The ```sh blocks of `readme`, each split into complete bash commands."""
    out: list[list[Command]] = []
    lines = readme.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if fence.startswith("```") and fence[3:].strip() in ("sh", "bash", "shell"):
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise SystemExit(f"readme: error: the block at README.md:{i + 1} is not closed")
            out.append(split_commands(len(out), start, lines[start:j]))
            i = j
        i += 1
    return out


def split_commands(block: int, first_line: int, lines: list[str]) -> list[Command]:
    commands: list[Command] = []
    pending: list[str] = []
    start = first_line
    for k, line in enumerate(lines):
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = first_line + k
        pending.append(line)
        text = "\n".join(pending)
        if text.endswith("\\"):
            continue
        if complete(text):
            commands.append(Command(block, start + 1, text))
            pending = []
    if pending:
        raise SystemExit(f"readme: error: the command at README.md:{start + 1} never ends:\n{chr(10).join(pending)}")
    return commands


def complete(text: str) -> bool:
    """Whether bash parses `text` as whole commands (an open quote or heredoc makes it incomplete)."""
    return subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0


class Server:
    """A server command running in the background, its stdout echoed and searched."""

    def __init__(self, cmd: Command):
        self.cmd = cmd
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.done = False
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {cmd.text}"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            with self.changed:
                self.lines.append(line.strip())
                self.changed.notify_all()
        with self.changed:
            self.done = True
            self.changed.notify_all()

    def wait_line(self, prefix: str, timeout: float) -> str:
        """The rest of the first stdout line starting with `prefix`, waiting for it to be printed."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line[len(prefix):].strip()
                left = deadline - time.monotonic()
                if self.done:
                    raise Failure(f"the server stopped without printing '{prefix}'")
                if left <= 0:
                    raise Failure(f"the server printed no '{prefix}' line in {timeout:.0f} s")
                self.changed.wait(left)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise Failure(f"the server did not stop within {STOP_TIMEOUT} s of SIGTERM")
        self.reader.join(10)
        return self.proc.returncode


class Failure(Exception):
    pass


def run_plain(cmd: Command) -> None:
    try:
        rc = subprocess.run(["bash", "-c", cmd.text], cwd=ROOT, timeout=COMMAND_TIMEOUT).returncode
    except subprocess.TimeoutExpired:
        raise Failure(f"still running after {COMMAND_TIMEOUT} s") from None
    if rc != 0:
        raise Failure(f"exit status {rc}")


def check_server(server: Server) -> None:
    server.wait_line("listening on http://", COMMAND_TIMEOUT)
    # The request the server tells a user to paste must work as printed.
    chat = server.wait_line("chat:", 30)
    out = subprocess.run(["bash", "-c", chat], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise Failure(f"the printed chat request failed (curl status {out.returncode}): {out.stderr.strip()}")
    try:
        reply = json.loads(out.stdout)
        text = reply["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise Failure(f"the printed chat request got no completion: {out.stdout[:500]}") from None
    print(f"readme: the printed chat request answered {text!r}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print what would run and what is skipped, run nothing")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--only", type=re.compile, help="run only the commands this regular expression finds")
    args = ap.parse_args()

    all_blocks = blocks(args.readme)
    summary: list[tuple[str, str, float]] = []
    for block in all_blocks:
        server: Server | None = None
        try:
            for cmd in block:
                if args.only and not args.only.search(cmd.text):
                    continue
                where = f"README.md:{cmd.line}"
                reason = cmd.skip_reason
                one_line = " ".join(cmd.text.split())
                if args.list:
                    print(f"{where}: {'skip (' + reason + ')' if reason else 'server' if cmd.is_server else 'run'}: "
                          f"{one_line}")
                    continue
                if reason:
                    print(f"\nreadme: {where}: skipped, {reason}: {one_line}", flush=True)
                    summary.append((where, f"skipped ({reason})", 0.0))
                    continue
                print(f"\nreadme: {where}: $ {one_line}", flush=True)
                t = time.monotonic()
                try:
                    if cmd.is_server:
                        if server is not None:
                            raise Failure("a second server in one block; end the block after its clients")
                        server = Server(cmd)
                        check_server(server)
                    else:
                        run_plain(cmd)
                except Failure as e:
                    print(f"readme: error: {where}: {e}: {one_line}", file=sys.stderr, flush=True)
                    return 1
                summary.append((where, "ok", time.monotonic() - t))
        finally:
            if server is not None:
                where = f"README.md:{server.cmd.line}"
                try:
                    rc = server.stop()
                except Failure as e:
                    print(f"readme: error: {where}: {e}", file=sys.stderr)
                    return 1
                if rc != 0:
                    print(f"readme: error: {where}: the server exited with status {rc} after SIGTERM",
                          file=sys.stderr)
                    return 1
                print(f"readme: {where}: the server drained and exited 0", flush=True)
    if not args.list:
        ran = sum(status == "ok" for _, status, _ in summary)
        print(f"\nreadme: {ran} commands ran, {len(summary) - ran} skipped"
              + (f" (only those matching {args.only.pattern!r})" if args.only else "") + ":")
        for where, status, secs in summary:
            print(f"  {where:16} {status}{f', {secs:.0f} s' if status == 'ok' else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
