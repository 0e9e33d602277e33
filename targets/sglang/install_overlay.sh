#!/usr/bin/env bash
# An overlay venv for sglang 0.5.10 - 0.5.15 (`--src` on their unpacked wheels, e.g. for --cache swa),
# over the base venv of targets/sglang/install.sh: those releases pin transformers 5.12.1, whose
# dependency checks want older tokenizers / huggingface-hub and a torchvision (no CPU torchvision wheel is
# served here: a metadata-only stand-in is written, enough for the image-processor registrations SGLang's
# configs make at import; nothing of it is ever called). docs/peers.md, "SGLang's sliding-window cache".
# Usage: targets/sglang/install_overlay.sh BASE_VENV OVERLAY_VENV; then SGLANG_PYTHON=OVERLAY_VENV/bin/python
set -euo pipefail
BASE=${1:?base venv (targets/sglang/install.sh)}
OV=${2:?overlay venv to create}
python3 -m venv "$OV"
SP=$("$OV/bin/python" -c "import site; print(site.getsitepackages()[0])")
BSP=$("$BASE/bin/python" -c "import site; print(site.getsitepackages()[0])")
echo "$BSP" > "$SP/zz-base.pth"                 # after the overlay's own packages: the overlay wins
"$OV/bin/pip" install -q --no-deps transformers==5.12.1 tokenizers==0.22.2 "huggingface-hub>=1.5,<2" \
    xgrammar==0.2.1 einops
mkdir -p "$SP/torchvision" "$SP/torchvision-0.28.0.dist-info"
printf 'Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n' > "$SP/torchvision-0.28.0.dist-info/METADATA"
touch "$SP/torchvision-0.28.0.dist-info/RECORD"
cat > "$SP/torchvision/__init__.py" <<'PY'
"""Metadata-only torchvision stand-in: every torchvision.* module imports, every attribute is a placeholder."""
import enum, importlib.abc, importlib.machinery, sys, types
__version__ = "0.28.0"
class InterpolationMode(enum.Enum):
    NEAREST, NEAREST_EXACT, BILINEAR, BICUBIC, BOX, HAMMING, LANCZOS = range(7)
class _Mod(types.ModuleType):
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        v = InterpolationMode if k == "InterpolationMode" else type(k, (), {"__init__": lambda s, *a, **kw: None})
        setattr(self, k, v)
        return v
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.startswith("torchvision.") else None
    def create_module(self, spec):
        m = _Mod(spec.name); m.__path__ = []; return m
    def exec_module(self, m):
        pass
sys.meta_path.append(_Finder())
PY
echo "SGLANG_PYTHON=$OV/bin/python"
