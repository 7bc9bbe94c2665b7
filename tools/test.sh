#!/usr/bin/env bash
# The whole test suite, in CI order: formatting, lints, every test of the
# workspace against the real IREE compiler and runtime, then the reference
# oracle recomputing every committed golden. Installs what is missing first
# (tools/dev/setup.sh; the oracle's venv, ~4.5 GB, goes to
# ~/.cache/mlxcel/oracle-venv once per machine, about 3.5 minutes).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/dev/setup.sh
. "$root/tools/dev/setup.sh"
cd "$root"
for tool in fmt clippy; do
  cargo "$tool" --version >/dev/null 2>&1 \
    || { echo "test: error: cargo $tool is missing; install the rustup component ($tool)" >&2; exit 1; }
done
step() { printf '\n== %s\n' "$*" >&2; }
step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --release --locked --workspace --all-targets -- -D warnings
step "cargo test"
# One profile everywhere: the IREE runtime is built once, in release mode.
cargo test --release --locked --workspace
step "in-tree plugins install and load (tools/build-plugins.sh)"
plugins="$(tools/build-plugins.sh)"
listing="$(target/release/mlxcel-host plugins list --plugins "$plugins")"
echo "$listing"
case "$listing" in
  *", 0 skipped"*) ;;
  *) echo "test: error: an in-tree plugin was skipped (see above)" >&2; exit 1 ;;
esac
step "benchmark script, quick variant (tools/bench/compare.py --quick: ratios printed, never asserted)"
"$(tools/oracle/setup.sh | tail -n 1)" tools/bench/compare.py --quick
step "oracle goldens reproduce (transformers / mlx-vlm)"
# Writes nothing: every fixture is recomputed in memory and compared, exactly where the
# numbers are portable across CPUs and floats within tools/oracle/check.py's bounds.
bash tools/oracle/regen.sh --check
step "the oracle check fails a real change (tools/oracle/test_check.py)"
"$(tools/oracle/setup.sh | tail -n 1)" tools/oracle/test_check.py
