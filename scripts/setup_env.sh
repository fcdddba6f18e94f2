#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtualenv in .venv with the CPU torch,
# fairseq (built from source, ~2-7 min on 2 cores) and this plugin.
# Idempotent: a second run only checks what is there.
#
# Offline (a machine with no package index, e.g. a GPU cluster), from a folder that
# scripts/make_wheelhouse.sh filled on a machine with one:
#   bash scripts/setup_env.sh --wheelhouse DIR [--dry-run]
# installs with --no-index from DIR only, after checking DIR against its SHA256SUMS.  A torch
# already importable in the venv (a CUDA build) is kept, whatever its version: it is never
# replaced, not even by a torch in DIR.  --dry-run prints the commands instead of running them.
set -euo pipefail
WHEELHOUSE="" DRY_RUN=""
while [ $# -gt 0 ]; do
    case "$1" in
    --wheelhouse)
        [ $# -ge 2 ] && [ -d "$2" ] || { echo "error: ${2:-DIR}: --wheelhouse needs an existing folder" >&2; exit 2; }
        WHEELHOUSE=$(cd "$2" && pwd); shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    *) echo "error: $1: unknown option (setup_env.sh [--wheelhouse DIR [--dry-run]])" >&2; exit 2 ;;
    esac
done
if [ -n "$DRY_RUN" ] && [ -z "$WHEELHOUSE" ]; then echo "error: --dry-run: only with --wheelhouse DIR" >&2; exit 2; fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ -n "$WHEELHOUSE" ]; then
    run() { if [ -n "$DRY_RUN" ]; then echo "+ $*"; else "$@"; fi; }
    # the wheelhouse's plan (WH_PYTHON, WH_TORCH, WH_FAIRSEQ, WH_BUILD), after its files are checked
    PLAN=$("$PY" scripts/wheelhouse.py check "$WHEELHOUSE")
    eval "$PLAN"
    VPY="$VENV/bin/python"
    [ -x "$VPY" ] && HAVE="$VPY" || HAVE="$PY"
    HAVE_VERSION=$("$HAVE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$HAVE_VERSION" != "$WH_PYTHON" ]; then
        echo "error: $WHEELHOUSE: made for Python $WH_PYTHON, $HAVE is Python $HAVE_VERSION" >&2; exit 2
    fi
    [ -x "$VPY" ] || run "$PY" -m venv "$VENV"
    export PIP_NO_INDEX=1
    PIP=("$VPY" -m pip install -q --no-index --find-links "$WHEELHOUSE")
    read -r -a BUILD <<< "$WH_BUILD"
    run "${PIP[@]}" "${BUILD[@]}"
    if [ -x "$VPY" ] && TORCH=$("$VPY" -c "import torch; print(torch.__version__)" 2>/dev/null); then
        echo "torch: keeping the installed torch $TORCH (never replaced)"
    elif [ -n "$WH_TORCH" ]; then
        run "${PIP[@]}" "$WH_TORCH"
        TORCH=$([ -n "$DRY_RUN" ] && echo "${WH_TORCH#torch==}" || "$VPY" -c "import torch; print(torch.__version__)")
    else
        echo "error: $WHEELHOUSE: torch is not importable in $VENV and the wheelhouse has none" \
            "(install the machine's torch into $VENV first, or make the wheelhouse with --with-torch)" >&2
        exit 2
    fi
    # nothing below may change torch: a conflict fails instead of replacing it
    PIN="$VENV/torch-constraint.txt"
    if [ -n "$DRY_RUN" ]; then echo "+ echo torch==$TORCH > $PIN"; else echo "torch==$TORCH" > "$PIN"; fi
    run "${PIP[@]}" -c "$PIN" -r "$WHEELHOUSE/requirements.txt"
    # fairseq and the plugin without their dependencies: requirements.txt holds them, less torchaudio.
    # fairseq compiles CUDA kernels of generation code (libnat_cuda, ngram_repeat_block_cuda) when
    # CUDA_HOME is set: minutes of nvcc that text training never uses, so it is built without it
    run env -u CUDA_HOME "${PIP[@]}" -c "$PIN" --no-build-isolation --no-deps "$WH_FAIRSEQ"
    run "${PIP[@]}" -c "$PIN" --no-build-isolation --no-deps -e .
    run "$VPY" -c "import fairseq, torch, seed_fairseq; print('fairseq', fairseq.__version__, '| torch', torch.__version__, '| seed_fairseq', seed_fairseq.__version__)"
    exit 0
fi
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
