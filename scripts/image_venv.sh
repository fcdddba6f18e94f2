#!/usr/bin/env bash
# A Python 3.12 venv that copies the lent GPU machine's image (scripts/device_image.txt: torch 2.11.0,
# numpy 2.5.2, transformers 5.17.0, sentence-transformers 6.0.1 ...) for the CPU rehearsal of
# scripts/device_check.sh (tests/test_device_rehearsal.py, docs/gpu.md), and for scripts/device_bundle.sh,
# which builds fairseq's wheel with it against the image's torch and numpy. Run where PyPI is reachable:
#
#   bash scripts/image_venv.sh [DIR]     # default: ~/.cache/seed_fairseq/image-py312
#
# PyPI's torch 2.11.0 for Linux is the CUDA 13 build (the image's, +cu130): it runs on the CPU, and with
# its CUDA libraries the venv takes ~5 GB. A second run only checks what is there. The interpreter is a
# Python 3.12: $PYTHON312, else python3.12 on PATH, else pyenv's. The machine's pip configuration
# (constraints, extra indexes) is left out: the image's versions are the point.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$HOME/.cache/seed_fairseq/image-py312}
is312() { [ -n "$1" ] && [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = 3.12 ]; }
PY312=${PYTHON312:-}
if ! is312 "$PY312"; then
    PY312=""
    for c in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
        if is312 "$c"; then PY312=$c; break; fi
    done
fi
[ -n "$PY312" ] || { echo "error: python3.12: none found (set PYTHON312=/path/to/python3.12)" >&2; exit 2; }
[ -x "$DIR/bin/python" ] || "$PY312" -m venv "$DIR"
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_CONSTRAINT PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL
"$DIR/bin/python" -m pip install -q --progress-bar off -r "$ROOT/scripts/device_image.txt"
"$DIR/bin/python" -c "import sys, torch, numpy, transformers; print('image venv $DIR: Python', sys.version.split()[0], '| torch', torch.__version__, '| numpy', numpy.__version__, '| transformers', transformers.__version__)"
