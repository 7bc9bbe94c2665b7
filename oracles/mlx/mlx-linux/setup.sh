#!/usr/bin/env bash
# Installs MLX's prebuilt CPU library (the PyPI wheel mlx-cpu, exactly the MLX release that
# mlx-sys 0.7.0's mlx-c is pinned to) into oracles/mlx/.mlx-cpu/, unless it is there.
# pip --target: no venv, and no PEP 668 check; --no-deps: the wheel is the library only.
# pip is the project venv's (tools/dev/setup.sh makes it) when there is one: Debian's python3
# may have no pip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
want="0.32.2"
stamp=.mlx-cpu/.mlxcel-mlx-cpu
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  printf 'mlx-oracles: installing mlx-cpu==%s into %s/.mlx-cpu\n' "$want" "$PWD" >&2
  rm -rf .mlx-cpu
  python="${MLXCEL_VENV:-../../.venv}/bin/python"
  [ -x "$python" ] || python=python3
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target .mlx-cpu \
    "mlx-cpu==$want"
  echo "$want" > "$stamp"
fi
test -f .mlx-cpu/mlx/lib/libmlx.so && test -f .mlx-cpu/mlx/share/cmake/MLX/MLXConfig.cmake
