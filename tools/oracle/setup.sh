#!/usr/bin/env bash
# Install the oracle venv once per machine, outside the clone; a fast no-op when it is already current.
#
#   tools/oracle/setup.sh          # prints the venv's python path on the last line
#
# Location: $ORACLE_VENV, else ${XDG_CACHE_HOME:-$HOME/.cache}/mlxcel/oracle-venv. The venv is keyed by
# requirements.lock: a changed lock (or python) rebuilds it from scratch. Packages come from PyPI only.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${ORACLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mlxcel/oracle-venv}"
python="${ORACLE_PYTHON:-python3}"
lock="$here/requirements.lock"
key="$( (cat "$lock"; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
stamp="$venv/.mlxcel-oracle-stamp"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$key" ]]; then
  echo "$venv/bin/python"
  exit 0
fi

echo "oracle: installing venv at $venv (about 3 minutes, 4.5 GB)" >&2
start=$SECONDS
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
# --no-deps: the lock is the complete closure, so pip resolves nothing and nothing floats.
"$venv/bin/pip" install --quiet --no-deps --no-cache-dir -r "$lock" >&2
"$venv/bin/python" - >&2 <<'PY'
import torch, transformers, torchvision, timm, mlx.core, mlx_vlm, mlx_lm  # noqa: F401
print("oracle: torch", torch.__version__, "transformers", transformers.__version__, "mlx", mlx.core.__version__)
PY
echo "$key" > "$stamp"
echo "oracle: venv ready in $((SECONDS - start)) s" >&2
echo "$venv/bin/python"
