#!/usr/bin/env bash
# The whole test suite, in CI order: formatting, lints, then every test of
# the workspace against the real IREE compiler and runtime. Installs what is
# missing first (tools/dev/setup.sh).
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
