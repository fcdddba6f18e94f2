#!/usr/bin/env bash
# The device bundle: what the lent GPU machine's image lacks, for one offline install there
# (scripts/device_check.sh; docs/gpu.md, "The lent GPU machine"). Run where the package index is
# reachable, with the project's .venv set up (scripts/setup_env.sh):
#
#   bash scripts/device_bundle.sh [OUT_DIR]      # default: device_bundle (git-ignored, carried)
#
# A wheelhouse (scripts/wheelhouse.py) for Python 3.12 / manylinux x86_64: fairseq-fixed's sdist (built
# on the machine), antlr4's sdist and the wheel built from it, wheels of hydra-core, omegaconf,
# bitarray, cffi and whatever else the project (with its hf extra) and fairseq need at run time that
# the image lacks, and setuptools/wheel for the build; SHA256SUMS and a hashed lock. Never: what
# scripts/device_image.txt lists (torch, numpy, transformers ... are the image's), faiss (26 MB, no
# CUDA 13 build on PyPI: gpu_check's faiss check says it is not installed) and blingfire (40 MB; only
# sentence splitting needs it, and gpu_check builds its data one paragraph per line).
# The interpreter that downloads the wheels is a Python 3.12: $PYTHON312, else python3.12 on PATH,
# else pyenv's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/device_bundle}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v "$PY" || true)
[ -n "$PY" ] || { echo "error: ${PYTHON:-.venv/bin/python}: no such interpreter (run scripts/setup_env.sh first)" >&2; exit 2; }
is312() { [ -n "$1" ] && [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = 3.12 ]; }
PY312=${PYTHON312:-}
if ! is312 "$PY312"; then
    PY312=""
    for c in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
        if is312 "$c"; then PY312=$c; break; fi
    done
fi
[ -n "$PY312" ] || { echo "error: python3.12: none found (set PYTHON312=/path/to/python3.12)" >&2; exit 2; }
"$PY" "$ROOT/scripts/wheelhouse.py" make --python 3.12 --platform manylinux_2_28_x86_64 --extras hf \
    --image "$ROOT/scripts/device_image.txt" --leave-out blingfire --download-python "$PY312" --out "$OUT"
echo "device bundle $OUT: $(du -sh --apparent-size "$OUT" | cut -f1) in $(ls "$OUT" | wc -l) files"
