#!/usr/bin/env bash
# mlx-vlm's own environment for ./dev check-mlx-vlm (docs/peers.md, "mlx-vlm"):
#   the project's mlx / mlx-lm / transformers versions (mlx[cpu] on Linux), mlx-vlm --no-deps (its full
#   dependency set adds opencv, datasets, mlx-audio and a FastAPI stack, none of which the prefix cache,
#   BatchGenerator or the qwen2_vl model imports), fastapi (server/generation.py imports it: the driver runs
#   its ResponseGenerator.generate for the APC salt), and this project's test needs (hypothesis, pytest).
# Usage: targets/mlx_vlm/install.sh [VENV] [MLX_VLM_VERSION]; then
#   MLXVLM_PYTHON=VENV/bin/python ./dev check-mlx-vlm ...
set -euo pipefail
VENV=${1:-${MLXVLM_VENV:-$HOME/.cache/prefix-trie-mlx/venv-mlxvlm}}
V=${2:-0.7.10}
python3 -m venv "$VENV"
P="$VENV/bin/pip"
MLX="mlx==0.32.4"
[ "$(uname -s)" = Linux ] && MLX="$MLX mlx-cpu==0.32.4"
"$P" install -q $MLX "mlx-lm==0.32.2" "transformers==5.25.0" numpy pillow jinja2 tqdm requests sentencepiece \
    hypothesis pytest pytest-xdist psutil fastapi
"$P" install -q --no-deps "mlx-vlm==$V"
echo "MLXVLM_PYTHON=$VENV/bin/python"
