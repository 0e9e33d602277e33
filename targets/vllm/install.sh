#!/usr/bin/env bash
# A venv that imports vLLM's prefix-cache managers, and nothing of its serving stack it does not need.
#   targets/vllm/install.sh [DIR]          (default ~/.cache/prefix-trie-mlx/venv-vllm)
#   VLLM_PYTHON=DIR/bin/python ./dev check-vllm ...
# vLLM is installed --no-deps (its wheel pins CUDA packages); torch is the CPU build (TORCH_WHEEL: a
# file or requirement; PyPI's Linux torch is the CUDA build -- a CPU wheel keeps the venv ~2 GB);
# the rest are the pure-Python (or small) packages vllm.v1.core's import chain reaches. Packages it
# names but never calls (xgrammar, llguidance, fastapi, ...) are stubbed at import (targets/vllm/stubs.py).
set -euo pipefail
DIR=${1:-$HOME/.cache/prefix-trie-mlx/venv-vllm}
VLLM=${VLLM_VERSION:-0.33.0}
TORCH=${TORCH_WHEEL:-torch}
python3 -m venv "$DIR"
P="$DIR/bin/pip"
"$P" install -q --no-deps "$TORCH" "vllm==$VLLM"
"$P" install -q --no-deps typing_extensions packaging psutil pyzmq urllib3 regex numpy msgspec pydantic \
    pydantic_core typing_inspection annotated_types sympy mpmath cbor2 transformers huggingface_hub tqdm \
    httpx2 httpcore2 truststore h11 idna pyyaml filelock safetensors tokenizers aiohttp multidict attrs yarl \
    propcache aiohappyeyeballs aiosignal frozenlist requests certifi openai_harmony openai sniffio anyio \
    pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo networkx prometheus_client jinja2 markupsafe \
    hypothesis sortedcontainers
"$DIR/bin/python" -c "import sys; sys.path.insert(0, '$(cd "$(dirname "$0")/../.." && pwd)'); \
from targets.vllm.engine import load; e = load(); print('vLLM', e.version, 'stubbed', e.stubbed)"
echo "VLLM_PYTHON=$DIR/bin/python ./dev check-vllm --minutes 10"
