#!/usr/bin/env bash
# llama.cpp for tools/bench/compare.py's `llama.cpp` system, from PyPI only: the sdist of llama-cpp-python carries
# llama.cpp's source under vendor/llama.cpp (its tools, its HF -> GGUF converter convert_hf_to_gguf.py and gguf-py).
# Idempotent: every step is skipped when its result is already there.
#
#   bash tools/bench/setup_llama_cpp.sh            # download, unpack, build (13 min here on 2 shared cores)
#   JOBS=1 bash tools/bench/setup_llama_cpp.sh     # fewer build jobs (default 2)
#
# Layout (under ~/.cache/mlxcel, or $MLXCEL_CACHE if set):
#   llama-venv/                    a small venv: pip, cmake, ninja, scikit-build-core (the sdist's build backend,
#                                  which pip runs to read the sdist's metadata; nothing is built with it)
#   llama.cpp/llama_cpp_python-<v>.tar.gz, llama.cpp/llama_cpp_python-<v>/vendor/llama.cpp (the source)
#   llama.cpp/build/bin/           llama-server, llama-bench, llama-batched-bench, llama-cli, llama-completion,
#                                  llama-mtmd-cli, llama-quantize, llama-tokenize
#   llama.cpp/build/SETUP.json     what was built and how (compare.py reads it)
#   llama.cpp/pydeps/              sentencepiece for the converter (pip --target)
#
# The converter runs with the oracle venv's python (torch, transformers, numpy, safetensors, pyyaml are there) and
# <vendor>/gguf-py, <vendor> and pydeps/ on its path: tools/bench/llama_cpp.py's `convert` does that. Nothing is
# installed into the oracle venv.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${MLXCEL_CACHE:-$HOME/.cache/mlxcel}"
VENV="$CACHE/llama-venv"
ROOT="$CACHE/llama.cpp"
SDIST="$ROOT/llama_cpp_python-$VERSION.tar.gz"
SRC="$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$ROOT/build"
JOBS="${JOBS:-2}"
ORACLE_PY="${ORACLE_PY:-$CACHE/oracle-venv/bin/python}"
TARGETS=(llama-server llama-bench llama-batched-bench llama-cli llama-completion llama-mtmd-cli llama-quantize
         llama-tokenize)

say() { echo "setup_llama_cpp: $*" >&2; }

# 1. The build venv.
if [ ! -x "$VENV/bin/cmake" ] || [ ! -x "$VENV/bin/ninja" ]; then
    say "creating $VENV (cmake, ninja, scikit-build-core from PyPI)"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q cmake ninja scikit-build-core
fi

# 2. The sdist. Only llama-cpp-python itself is taken as source (--no-binary for it alone: --no-binary :all: would
# build cmake from source for the isolated build env); --no-build-isolation uses the venv's scikit-build-core to read
# its metadata.
mkdir -p "$ROOT"
if [ ! -s "$SDIST" ]; then
    say "downloading llama-cpp-python==$VERSION (sdist)"
    tmp="$(mktemp -d "$ROOT/dl.XXXXXX")"
    "$VENV/bin/python" -m pip download -q --no-deps --no-build-isolation --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$tmp"
    mv "$tmp/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
    rm -rf "$tmp"
fi

# 3. The source.
if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
    say "unpacking $SDIST"
    rm -rf "$ROOT/llama_cpp_python-$VERSION"
    tar -xzf "$SDIST" -C "$ROOT"
fi
for need in CMakeLists.txt convert_hf_to_gguf.py gguf-py/gguf/__init__.py tools/server tools/mtmd; do
    [ -e "$SRC/$need" ] || { say "$SRC/$need is missing: not the expected llama.cpp tree"; exit 1; }
done

# 4. The build: native CPU flags (GGML_NATIVE: AVX-512 and its bf16 instructions where the CPU has them), Release, no
# tests or examples, no web UI (the prebuilt one would be fetched from a hub at build time), no curl or OpenSSL (the
# tools load local files only).
if [ ! -f "$BUILD/SETUP.json" ] || [ "$(cat "$BUILD/SETUP.version" 2>/dev/null)" != "$VERSION" ]; then
    export PATH="$VENV/bin:$PATH"
    say "configuring $BUILD"
    start=$(date +%s)
    cmake -S "$SRC" -B "$BUILD" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$ROOT/cmake-configure.log" 2>&1 \
        || { tail -40 "$ROOT/cmake-configure.log" >&2; exit 1; }
    # The targets this version has (the set of tools differs between llama.cpp versions).
    listed="$(cmake --build "$BUILD" --target help 2>/dev/null)"
    have=()
    for t in "${TARGETS[@]}"; do
        if grep -q "^$t:" <<<"$listed"; then have+=("$t"); fi
    done
    say "building ${have[*]} with $JOBS jobs (log: $ROOT/cmake-build.log)"
    cmake --build "$BUILD" -j "$JOBS" --target "${have[@]}" >"$ROOT/cmake-build.log" 2>&1 \
        || { tail -40 "$ROOT/cmake-build.log" >&2; exit 1; }
    took=$(( $(date +%s) - start ))
    # GGML_NATIVE compiles with -march=native (the GGML_AVX512* options stay OFF and are ignored): what it enables.
    native="$(echo | "${CC:-cc}" -march=native -dM -E - \
              | grep -oE '__(AVX512[A-Z0-9_]*|AVX2|FMA|F16C|AMX[A-Z0-9_]*)__' | sort -u | tr '\n' ' ')"
    python3 - "$BUILD/SETUP.json" "$VERSION" "$SRC" "$took" "$native" "${have[@]}" <<'EOF'
import json, sys, platform
out, version, src, took, native, *targets = sys.argv[1:]
json.dump({"llama_cpp_python": version, "source": src, "build_seconds": int(took), "targets": targets,
           "cmake_flags": "-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "
                          "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF "
                          "-DLLAMA_USE_PREBUILT_UI=OFF",
           "march_native": native.split(), "machine": platform.machine()}, open(out, "w"), indent=1)
EOF
    echo "$VERSION" >"$BUILD/SETUP.version"
    say "built in ${took}s"
fi

# 5. The converter's imports, with the oracle venv's python and the vendor tree's gguf-py. The one it lacks is
# sentencepiece (the Qwen2-VL converter tries a tokenizer.model first, importing sentencepiece before it looks for the
# file): installed beside, in pydeps/ (--target, for the same Python version), not into the oracle venv.
PYDEPS="$ROOT/pydeps"
if [ ! -d "$PYDEPS/sentencepiece" ]; then
    say "installing sentencepiece into $PYDEPS"
    "$VENV/bin/python" -m pip install -q --target "$PYDEPS" "sentencepiece>=0.1.98,<0.3.0"
fi
if [ -x "$ORACLE_PY" ]; then
    if PYTHONPATH="$SRC/gguf-py:$SRC:$PYDEPS" "$ORACLE_PY" \
            -c "import gguf, torch, transformers, numpy, yaml, sentencepiece" 2>/dev/null; then
        say "converter: $ORACLE_PY with PYTHONPATH=$SRC/gguf-py:$SRC:$PYDEPS"
    else
        say "warning: $ORACLE_PY lacks one of gguf's or the converter's imports (numpy, pyyaml, tqdm, requests, torch,"
        say "         transformers): the converter will not run with it"
    fi
else
    say "warning: no oracle venv at $ORACLE_PY (the converter needs torch and transformers: tools/oracle's venv)"
fi
"$BUILD/bin/llama-server" --version 2>&1 | head -3 >&2 || true
say "done: $BUILD/bin"
