#!/usr/bin/env bash
# Puts every in-tree family plugin into one plugin directory, the one the
# README's run command uses: for each manifest in manifests/, builds the
# workspace crate whose cdylib is the manifest's `library`, then installs the
# library and a copy of the manifest with the library's sha256 stamped in (the
# committed manifests carry a placeholder hash: the real one changes with every
# build). The directory is replaced as a whole, so no stale plugin survives.
#
# Usage: tools/build-plugins.sh [OUT_DIR [MANIFEST_DIR]]
#   OUT_DIR       default target/plugins
#   MANIFEST_DIR  default manifests
# Prints the directory. A no-op rebuild takes about a second.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/dev/setup.sh
. "$root/tools/dev/setup.sh"
cd "$root"
out="${1:-$root/target/plugins}"
manifests="${2:-$root/manifests}"

die() { printf 'build-plugins: error: %s\n' "$*" >&2; exit 1; }

# Which package builds each manifest's library: cdylib targets of workspace members.
plan="$(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, pathlib, sys, tomllib
meta = json.load(sys.stdin)
libraries = {}
for package in meta["packages"]:
    for target in package["targets"]:
        if "cdylib" in target["kind"]:
            libraries["lib" + target["name"].replace("-", "_") + ".so"] = package["name"]
for manifest in sorted(pathlib.Path(sys.argv[1]).glob("*.toml")):
    library = tomllib.loads(manifest.read_text())["plugin"]["library"]
    if library not in libraries:
        sys.exit(f"build-plugins: error: {manifest}: no workspace crate builds {library}")
    print(libraries[library], library, manifest)
' "$manifests")"

packages=()
while read -r package _ _; do
  [ -n "$package" ] && packages+=(-p "$package")
done <<< "$plan"
if [ ${#packages[@]} -gt 0 ]; then
  cargo build --release --locked -q "${packages[@]}"
fi

mkdir -p "$(dirname "$out")"
staging="$(mktemp -d "$out.new.XXXXXX")"
chmod 755 "$staging"
trap 'rm -rf "$staging"' EXIT
count=0
while read -r _ library manifest; do
  [ -n "$library" ] || continue
  built="$root/target/release/$library"
  [ -f "$built" ] || die "$built was not built"
  cp "$built" "$staging/$library"
  sha="$(sha256sum "$built" | cut -d' ' -f1)"
  installed="$staging/$(basename "$manifest")"
  sed -E "s/^sha256[[:space:]]*=[[:space:]]*\"[^\"]*\"/sha256 = \"$sha\"/" "$manifest" > "$installed"
  grep -q "^sha256 = \"$sha\"" "$installed" || die "$manifest has no sha256 line to stamp"
  count=$((count + 1))
done <<< "$plan"
rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
printf 'build-plugins: %d plugin(s) in %s\n' "$count" "$out" >&2
echo "$out"
