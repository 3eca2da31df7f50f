#!/usr/bin/env bash
# Create .venv and install localspec into it (add "test" for the test extras; --with-models also fetches the
# Qwen2.5-Coder test pair, downloading it while llama-cpp-python builds).
#
# llama-cpp-python is built from source. On x86-64 Linux the default build
# here is portable AVX2 (GGML_NATIVE=OFF): a -march=native build enables
# ggml's AMX kernels on CPUs that report AMX, and those crash inside VMs that
# do not grant AMX state. Set CMAKE_ARGS yourself for other builds, e.g.
#   CMAKE_ARGS="-DGGML_CUDA=on" bash scripts/install.sh
# The built wheel is kept under ~/.cache/localspec/wheels, keyed by version,
# platform, Python version and CMAKE_ARGS, so a second install (or CI) does not
# rebuild it, and a build with other CMAKE_ARGS (CUDA after a CPU build) gets a
# folder of its own and replaces the llama-cpp-python installed in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

# macOS has shasum where Linux has sha256sum; both print the digest first
sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }

LLAMA_VERSION=0.3.36  # keep in step with pyproject.toml
PYTHON=${PYTHON:-python3}
extras=
fetch_models=
for arg in "$@"; do
  case "$arg" in
    --with-models) fetch_models=1 ;;
    -*) echo "install.sh: unknown option $arg (known: --with-models)" >&2; exit 2 ;;
    *) extras=$arg ;;
  esac
done

if [[ -z "${CMAKE_ARGS:-}" ]] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "install.sh: an NVIDIA GPU is present but CMAKE_ARGS is unset, so this builds for the CPU only; for CUDA run" >&2
  echo "  CMAKE_ARGS=\"-DGGML_CUDA=on\" bash scripts/install.sh $*" >&2
fi
if [[ -z "${CMAKE_ARGS:-}" && "$(uname -s)" == Linux && "$(uname -m)" == x86_64 ]]; then
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
export CMAKE_ARGS="${CMAKE_ARGS:-}"
# Skip llama.cpp's "common" library, which the Python package never loads (see the file); the cache key
# below names the file's content rather than this checkout's path, so clones share the built wheel.
lean=scripts/llama_cpp_lean.cmake
key_args="$CMAKE_ARGS|$(sha256 "$lean" | cut -c1-16)"
export CMAKE_ARGS="$CMAKE_ARGS -DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/$lean"
# Compile on every core whichever generator CMake picks (Make alone would compile one file at a time).
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"

if [[ ! -x .venv/bin/python ]]; then
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "install.sh: $PYTHON not found; install Python 3.10 or newer and name it: PYTHON=python3.12 bash scripts/install.sh ..." >&2
    exit 1
  fi
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "install.sh: localspec needs Python 3.10 or newer; $PYTHON is $("$PYTHON" -c 'import platform; print(platform.python_version())')." >&2
    echo "  Install a newer one (macOS: brew install python@3.12) and name it: PYTHON=python3.12 bash scripts/install.sh ..." >&2
    exit 1
  fi
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
fetch_pid=
if [[ -n "$fetch_models" ]]; then
  # The download needs only the standard library and pip, so it overlaps the build instead of following it.
  .venv/bin/python scripts/fetch_test_models.py >/dev/null 2>.venv/fetch.log &
  fetch_pid=$!
fi

key=$(printf '%s|%s|%s|%s' "$LLAMA_VERSION" "$(uname -sm)" "$(.venv/bin/python -c 'import sys; print(sys.version_info[:2])')" "$key_args" | sha256 | cut -c1-16)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/localspec/wheels/$key"
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION (a few minutes; CMAKE_ARGS=$CMAKE_ARGS)" >&2
  mkdir -p "$wheels.tmp"
  .venv/bin/python -m pip wheel --quiet --no-deps --no-cache-dir -w "$wheels.tmp" "llama-cpp-python==$LLAMA_VERSION"
  rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
fi
# The same version built with other CMAKE_ARGS (a CPU build, then CUDA) must replace the installed one, so the
# venv records which build it holds; a rerun with the same settings reinstalls nothing.
if [[ "$(cat .venv/.llama-cpp-build 2>/dev/null)" != "$key" ]]; then
  .venv/bin/python -m pip install --quiet --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
  echo "$key" > .venv/.llama-cpp-build
fi
# its dependencies (numpy, diskcache, jinja2, typing-extensions), which --no-deps left out
.venv/bin/python -m pip install --quiet "$wheels"/llama_cpp_python-*.whl
if [[ -n "$extras" ]]; then
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
else
  .venv/bin/python -m pip install --quiet -e .
fi
if [[ -n "$fetch_pid" ]]; then
  if ! wait "$fetch_pid"; then
    cat .venv/fetch.log >&2
    echo "install.sh: fetching the test models failed (above); run .venv/bin/python scripts/fetch_test_models.py" >&2
    exit 1
  fi
  .venv/bin/python scripts/fetch_test_models.py >/dev/null  # verified already: registers them as the built-in pair
fi
