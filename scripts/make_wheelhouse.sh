#!/usr/bin/env bash
# Every wheel and sdist the project needs, for a machine with no package index (a GPU cluster):
#   bash scripts/make_wheelhouse.sh --python 3.11 --platform manylinux_2_28_x86_64 --out wheelhouse \
#        [--extras test] [--with-torch]
# (--prebuild-python PY: fairseq's wheel too, built with the target image's interpreter or a venv copying
# it, installed there only where it fits: scripts/device_bundle.sh) then, on that machine, with the
# repository and DIR copied over:
#   bash scripts/setup_env.sh --wheelhouse wheelhouse
# torch is left out unless --with-torch: the GPU machine keeps its own CUDA torch.  Runs
# scripts/wheelhouse.py (what goes into DIR and why) with $PYTHON, by default the project's
# .venv/bin/python: reading fairseq's sdist needs torch (run scripts/setup_env.sh here first).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
exec "$PY" "$ROOT/scripts/wheelhouse.py" make "$@"
