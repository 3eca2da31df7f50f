#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama.cpp source that localspec runs (the copy vendored in the
# llama-cpp-python sdist that pyproject.toml pins), once: the binary is kept under
# ~/.cache/localspec/llama-server, keyed by version, platform and build flags, and a second run only prints
# its path. The export tests (tests/export/test_export_run.py) start it; benchmarks can use it as a peer engine.
#
#   bash scripts/build_llama_server.sh        # builds if needed, prints the binary's path on stdout
#
# On 2 cores the build takes about 25 minutes; it runs at the lowest CPU priority. Set CMAKE_ARGS for other
# builds (as for install.sh); the default on x86-64 Linux is the same portable AVX2 build install.sh uses.
set -euo pipefail
cd "$(dirname "$0")/.."

# macOS has shasum where Linux has sha256sum; both print the digest first
sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }

LLAMA_VERSION=0.3.36  # keep in step with pyproject.toml
PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python

if [[ -z "${CMAKE_ARGS:-}" && "$(uname -s)" == Linux && "$(uname -m)" == x86_64 ]]; then
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
CMAKE_ARGS="${CMAKE_ARGS:-}"
key=$(printf '%s|%s|%s' "$LLAMA_VERSION" "$(uname -sm)" "$CMAKE_ARGS" | sha256 | cut -c1-16)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/localspec/llama-server/$key"
if [[ -x "$cache/llama-server" ]]; then
  echo "$cache/llama-server"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "downloading the llama-cpp-python $LLAMA_VERSION source" >&2
"$PYTHON" -m pip download --quiet --no-binary :all: --no-deps --dest "$work" "llama-cpp-python==$LLAMA_VERSION"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
[[ -f "$src/CMakeLists.txt" ]] || { echo "build_llama_server.sh: no vendor/llama.cpp in the sdist ($src)" >&2; exit 1; }

jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
echo "building llama-server (about 25 minutes on 2 cores; CMAKE_ARGS=$CMAKE_ARGS)" >&2
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of words
nice -n 19 cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON $CMAKE_ARGS >&2
nice -n 19 cmake --build "$work/build" --target llama-server -j "$jobs" >&2
"$work/build/bin/llama-server" --version >&2
mkdir -p "$cache.tmp"
cp "$work/build/bin/llama-server" "$cache.tmp/"
printf '%s\n' "$CMAKE_ARGS" >"$cache.tmp/cmake_args"
rm -rf "$cache" && mv "$cache.tmp" "$cache"
echo "$cache/llama-server"
