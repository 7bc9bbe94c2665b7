#!/usr/bin/env bash
# The main job: installs what is missing (tools/dev/setup.sh), builds the
# host and the in-tree plugins (tools/build-plugins.sh, into target/plugins)
# and runs the host. With no arguments it serves the bundled tiny Qwen2-VL
# checkpoint (tests/fixtures/qwen2_vl) over the OpenAI API on port 8000 and
# prints a request to paste; any arguments go to mlxcel-host instead.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/dev/setup.sh
. "$root/tools/dev/setup.sh"
cd "$root"
cargo build --release --locked -q -p mlxcel-host
# Every in-tree plugin, with its manifest, in target/plugins (about a second
# when nothing changed); the host reads that directory unless told otherwise.
plugins="$("$root/tools/build-plugins.sh" 2>/dev/null)"
export MLXCEL_PLUGINS="${MLXCEL_PLUGINS:-$plugins}"
if [ $# -eq 0 ]; then
  set -- serve --model "$root/tests/fixtures/qwen2_vl" --context 512 --chunk 32
fi
exec "$root/target/release/mlxcel-host" "$@"
