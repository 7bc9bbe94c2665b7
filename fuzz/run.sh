#!/usr/bin/env bash
# Builds every fuzz target (fuzz/fuzz_targets/, cargo fuzz with libFuzzer and AddressSanitizer,
# release with debug assertions and overflow checks) and runs each for a bounded time from its
# committed seeds (fuzz/seeds/<target>/) and the corpus earlier runs grew (fuzz/corpus/<target>/,
# not committed). Prints executions and crashes per target; exits non-zero when any target
# crashed, leaving the input in fuzz/artifacts/<target>/ (turn it into a regression test beside
# the code it breaks, then delete it).
#
# cargo fuzz needs nightly's -Z flags; the stable toolchain accepts them with RUSTC_BOOTSTRAP=1,
# so no nightly is installed. cargo-fuzz itself is installed from crates.io when missing.
#
# Usage: fuzz/run.sh [--seconds S] [--parallel N] [--skip TARGET]... [TARGET...]
#   --seconds S    fuzzing time per target (default 3)
#   --parallel N   targets fuzzed at once (default 1; one core each)
#   --skip TARGET  leave TARGET out (one with a known crash awaiting its fix)
#   TARGET         only these targets (default: all, as `cargo fuzz list` names them)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# cmake and nasm: libjpeg-turbo is built from source for the media target.
# shellcheck source=tools/dev/setup.sh
. "$root/tools/dev/setup.sh"

cargo_fuzz_version="0.13.1"
seconds=3
parallel=1
targets=()
skip=" "
die() { printf 'fuzz: error: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) [ $# -ge 2 ] || die "--seconds needs a value"; seconds="$2"; shift 2 ;;
    --parallel) [ $# -ge 2 ] || die "--parallel needs a value"; parallel="$2"; shift 2 ;;
    --skip) [ $# -ge 2 ] || die "--skip needs a target"; skip+="$2 "; shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || die "--seconds takes a whole number of seconds, not $seconds"
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || die "--parallel takes a positive whole number, not $parallel"

if ! cargo fuzz --version 2>/dev/null | grep -qF " $cargo_fuzz_version"; then
  printf 'fuzz: installing cargo-fuzz %s from crates.io\n' "$cargo_fuzz_version" >&2
  cargo install cargo-fuzz --version "=$cargo_fuzz_version" --locked --quiet
fi

export RUSTC_BOOTSTRAP=1
cd "$root/fuzz"
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
kept=()
for target in "${targets[@]}"; do
  case "$skip" in *" $target "*) printf 'fuzz: skipping %s\n' "$target" >&2 ;; *) kept+=("$target") ;; esac
done
targets=("${kept[@]}")
# cargo fuzz's default build: release, with the overflow checks and debug assertions a test
# build has. 16 codegen units, not its 1: half the build time for somewhat slower runs.
cargo fuzz build --codegen-units 16
triple="$(rustc -vV | sed -n 's/^host: //p')"
bin="$root/fuzz/target/$triple/release"

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

fuzz_one() {
  local target="$1" log="$logs/$1.log"
  [ -x "$bin/$target" ] || die "no fuzz target $target (cargo fuzz list names them)"
  mkdir -p "corpus/$target" "artifacts/$target"
  local seeds=()
  [ -d "seeds/$target" ] && seeds=("seeds/$target")
  # -timeout: one input running 10 s is a hang; -rss_limit_mb: an input needing 2 GB is a crash.
  set +e
  "$bin/$target" "corpus/$target" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="artifacts/$target/" -print_final_stats=1 >"$log" 2>&1
  echo $? >"$log.rc"
  set -e
}

running=0
for target in "${targets[@]}"; do
  fuzz_one "$target" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=0
printf '%-24s %12s %10s %8s  %s\n' target executions exec/s crashes artifact
for target in "${targets[@]}"; do
  log="$logs/$target.log"
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  [ -n "$runs" ] || runs="$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -n 1)"
  [ -n "$runs" ] || runs="$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -n 1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)"
  artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)"
  crashes=0
  if [ "$(cat "$log.rc")" != 0 ] || [ -n "$artifact" ]; then
    crashes=1
    failed=1
    printf '\nfuzz: %s crashed; the end of its log:\n' "$target" >&2
    grep -v '^#[0-9]' "$log" | tail -n 40 >&2
  fi
  printf '%-24s %12s %10s %8s  %s\n' "$target" "${runs:-?}" "${rate:-?}" "$crashes" "${artifact:+fuzz/$artifact}"
done
if [ "$failed" != 0 ]; then
  printf 'fuzz: error: a target crashed; reproduce with %s/<target> <artifact>\n' "fuzz/target/$triple/release" >&2
  exit 1
fi
