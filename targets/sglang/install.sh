#!/usr/bin/env bash
# The lightest environment SGLang's radix caches import in, on the CPU (docs/peers.md, "SGLang"):
#   torch's CPU wheel (no CUDA packages), sglang --no-deps, the dozen small pure-Python packages its
#   mem_cache import chain really executes, and this project's own needs (hypothesis, pytest).
#   GPU-only packages (triton, tvm_ffi, ...) are stood in for at import by targets/sglang/stubs.py.
# Usage: targets/sglang/install.sh [VENV] [SGLANG_VERSION]; then
#   SGLANG_PYTHON=VENV/bin/python ./dev check-sglang ...
set -euo pipefail
VENV=${1:-${SGLANG_VENV:-$HOME/.cache/prefix-trie-mlx/venv-sglang}}
V=${2:-0.5.23}
TORCH=${TORCH_CPU_WHEEL:-torch==2.13.0+cpu}   # a CPU build: PyPI's Linux torch pulls ~3 GB of CUDA wheels
python3 -m venv "$VENV"
P="$VENV/bin/pip"
"$P" install -q --no-deps "$TORCH" "sglang==$V" "transformers==5.19.0"
"$P" install -q typing_extensions sympy filelock networkx jinja2 fsspec numpy orjson psutil pybase64 requests \
    packaging pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp dill fastapi "openai==2.8.0" \
    huggingface_hub tokenizers safetensors regex pyyaml hypothesis pytest
echo "SGLANG_PYTHON=$VENV/bin/python"
