#!/usr/bin/env bash
# Installs what building and testing mlxcel-host needs, and nothing that is
# already there: Debian's libclang (bindgen), build tools and nasm (libjpeg-turbo's
# SIMD, built from source by the image decoder), a project-local
# Python venv with PyPI cmake (eerie-sys needs >= 3.26) and the IREE compiler
# wheel, and a copy of eerie-sys whose build script does not re-run CMake on
# every cargo call. Safe to run repeatedly and from several shells.
#
# Prints nothing on the fast path. tools/run.sh and tools/test.sh source it
# (it exports PATH and MLXCEL_VENV); the caller's shell options are restored
# at the end, and a failure exits the caller with a clear message.
# (Read directly, not through $(set +o): a command substitution does not
# inherit errexit, so it would report it off.)
_mlxcel_restore=""
case "$-" in *e*) ;; *) _mlxcel_restore+="set +e;" ;; esac
case "$-" in *u*) ;; *) _mlxcel_restore+="set +u;" ;; esac
shopt -qo pipefail || _mlxcel_restore+="set +o pipefail;"
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${MLXCEL_VENV:-$root/.venv}"
# Bump when the pinned Python requirements change; the venv is rebuilt.
requirements="cmake>=3.26,<5 iree-base-compiler==3.13.0 openai==3.57.0"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# 1. Debian packages.
need_apt=()
for pkg in libclang-dev build-essential pkg-config nasm; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq || die "apt-get update failed; check the network or run it yourself"
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need_apt[@]}" \
    || die "could not install ${need_apt[*]} with apt-get; install them and re-run"
fi

# 2. Project venv with cmake and the IREE compiler wheel.
stamp="$venv/.mlxcel-requirements"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$requirements" ]; then
  command -v python3 >/dev/null || die "python3 is missing; install Debian's python3 and python3-venv"
  say "creating $venv with: $requirements"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "python3 -m venv failed; install Debian's python3-venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q --disable-pip-version-check $requirements \
    || die "pip could not install $requirements from PyPI"
  echo "$requirements" > "$stamp"
fi
cmake_version="$("$venv/bin/cmake" --version | head -1 | awk '{print $3}')"
case "$cmake_version" in
  3.2[6-9]*|3.[3-9]*|[4-9].*) ;;
  *) die "cmake $cmake_version in $venv is older than 3.26; delete $venv and re-run" ;;
esac

# 3. eerie-sys with its always-dirty rerun-if-changed removed, and the IREE
# runtime's VM instruction tables generated into its source tree. The workspace
# Cargo.toml patches eerie-sys to this directory, so cargo needs it before it
# can resolve anything; a throwaway project fetches the pristine crate from
# crates.io (checksum-verified by cargo) to copy from. The marker names the
# version of these edits, so an older copy is made again.
patched="$root/.deps/eerie-sys"
marker=".mlxcel-patched-2"
if [ ! -f "$patched/$marker" ]; then
  fetch="$root/.deps/fetch"
  mkdir -p "$fetch/src"
  cat > "$fetch/Cargo.toml" <<'TOML'
[package]
name = "mlxcel-fetch-eerie-sys"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
eerie-sys = { version = "=0.5.0", default-features = false }

[workspace]
TOML
  : > "$fetch/src/lib.rs"
  (cd "$fetch" && cargo fetch -q) || die "cargo could not fetch eerie-sys 0.5.0 from crates.io"
  registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
  src="$(ls -d "$registry"/*/eerie-sys-0.5.0 2>/dev/null | head -1)"
  [ -n "$src" ] || die "eerie-sys 0.5.0 is not in $registry after cargo fetch"
  rm -rf "$patched.tmp"
  cp -r "$src" "$patched.tmp"
  "$venv/bin/python" - "$patched.tmp/build.rs" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
old = '''        println!(
            "cargo:rerun-if-changed={}",
            additional_include_path.display()
        );
'''
if old not in text:
    sys.exit("setup: error: eerie-sys build.rs changed; the rerun patch no longer applies")
open(path, "w").write(text.replace(old, ""))
PY
  # The runtime's CMake build generates op_table.h and encoding_table.h (from
  # isa.json) in a custom command that the bytecode utils objects, which include
  # them, are not ordered after: under make -j a new build could compile
  # block_list.c first and fail ("iree/vm/bytecode/isa/op_table.h: No such file
  # or directory"; building that objects target alone fails every time). In the
  # source tree the headers are found whatever the order; the build's own copies
  # in its binary tree are the same bytes.
  isa="$patched.tmp/iree/runtime/src/iree/vm/bytecode/isa"
  "$venv/bin/python" "$patched.tmp/iree/build_tools/scripts/generate_vm_isa.py" --schema "$isa/isa.json" \
    --op-table "$isa/op_table.h" --encoding-table-header "$isa/encoding_table.h" \
    || die "could not generate the IREE runtime's VM instruction tables"
  touch "$patched.tmp/$marker"
  rm -rf "$patched"
  mv "$patched.tmp" "$patched"
fi

# What the caller needs: cmake >= 3.26 on PATH for eerie-sys's build script.
export PATH="$venv/bin:$PATH"
export MLXCEL_VENV="$venv"
eval "$_mlxcel_restore"
unset _mlxcel_restore
