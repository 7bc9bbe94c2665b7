#!/usr/bin/env bash
# The main job: installs what is missing (tools/dev/setup.sh), builds the
# host and the in-tree plugins (tools/build-plugins.sh, into target/plugins)
# and runs the host. With no arguments it compiles and runs the bundled
# StableHLO program and checks the result; any arguments go to mlxcel-host.
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
if [ $# -eq 0 ]; then set -- demo; fi
exec "$root/target/release/mlxcel-host" "$@"
