#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtualenv in .venv with the CPU torch,
# fairseq (built from source, ~2-7 min on 2 cores) and this plugin.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel
# torch first and pinned: this version is the local CPU build; anything that
# lets pip choose would download a CUDA build of several GB.
$PIP install -q "torch==2.13.0" "numpy>=1.21.3,<2.3" cython
# fairseq's sdist declares torch as a build requirement: build it against the
# torch installed above instead of a throwaway (CUDA) copy in an isolated env.
$PIP install -q --no-build-isolation -e ".[test]"
# fairseq pulls torchaudio; its build here does not match torch and breaks
# `import transformers`. Text training never uses it.
$PIP uninstall -q -y torchaudio 2>/dev/null || true
"$VENV/bin/python" -c "import fairseq, torch, seed_fairseq; print('fairseq', fairseq.__version__, '| torch', torch.__version__, '| seed_fairseq', seed_fairseq.__version__)"
