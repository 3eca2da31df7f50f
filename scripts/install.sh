#!/usr/bin/env bash
# Create .venv and install localspec into it (add "test" for the test extras).
#
# llama-cpp-python is built from source. On x86-64 Linux the default build
# here is portable AVX2 (GGML_NATIVE=OFF): a -march=native build enables
# ggml's AMX kernels on CPUs that report AMX, and those crash inside VMs that
# do not grant AMX state. Set CMAKE_ARGS yourself for other builds, e.g.
#   CMAKE_ARGS="-DGGML_CUDA=on" bash scripts/install.sh
# The built wheel is kept under ~/.cache/localspec/wheels, keyed by version,
# platform and CMAKE_ARGS, so a second install (or CI) does not rebuild it.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36  # keep in step with pyproject.toml
PYTHON=${PYTHON:-python3}
extras=${1:-}

if [[ -z "${CMAKE_ARGS:-}" && "$(uname -s)" == Linux && "$(uname -m)" == x86_64 ]]; then
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF"
fi
export CMAKE_ARGS="${CMAKE_ARGS:-}"

[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip

key=$(printf '%s|%s|%s|%s' "$LLAMA_VERSION" "$(uname -sm)" "$(.venv/bin/python -c 'import sys; print(sys.version_info[:2])')" "$CMAKE_ARGS" | sha256sum | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/localspec/wheels/$key"
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION (a few minutes; CMAKE_ARGS=$CMAKE_ARGS)" >&2
  mkdir -p "$wheels.tmp"
  .venv/bin/python -m pip wheel --quiet --no-deps --no-cache-dir -w "$wheels.tmp" "llama-cpp-python==$LLAMA_VERSION"
  rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
fi
.venv/bin/python -m pip install --quiet "$wheels"/llama_cpp_python-*.whl
if [[ -n "$extras" ]]; then
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
else
  .venv/bin/python -m pip install --quiet -e .
fi
