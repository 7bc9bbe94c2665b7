#!/usr/bin/env bash
# MLX micro-oracles (README "MLX micro-oracles"): builds this crate, which lives outside the
# root workspace, and runs its unit tests and its report. Exits non-zero only when a case falls
# below its stated claim (an exact case stops being exact, a closeness bound is exceeded), a
# mutant of a case is not caught, or a unit test fails.
#
# What it needs, installed when missing:
# - the project's set-up (tools/dev/setup.sh): Debian's libclang-dev (bindgen, for mlx-sys as
#   for eerie-sys) and build-essential, cmake >= 3.26 on PATH from the project venv (mlx-c needs
#   >= 3.16), the IREE compiler wheel, .deps/eerie-sys (patched in by this crate's Cargo.toml too);
# - MLX itself, the PyPI wheel mlx-cpu==0.32.2 in oracles/mlx/.mlx-cpu (mlx-linux/setup.sh).
# The build settings (rustc wrapper, CMake toolchain file, bindgen flags) are in
# oracles/mlx/.cargo/config.toml, read because cargo runs in this directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../tools/dev/setup.sh
. "$here/../../tools/dev/setup.sh"
"$here/mlx-linux/setup.sh"
cd "$here"
cargo test --release --locked --quiet
cargo run --release --locked --quiet
