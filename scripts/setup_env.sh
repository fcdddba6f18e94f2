#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtualenv in .venv with the CPU torch,
# fairseq (built from source, ~2-7 min on 2 cores) and this plugin.
# Idempotent: a second run only checks what is there.
#
# Offline (a machine with no package index, e.g. a GPU cluster), from a folder that
# scripts/make_wheelhouse.sh filled on a machine with one:
#   bash scripts/setup_env.sh --wheelhouse DIR [--system-site-packages] [--dry-run]
# installs from DIR only: DIR is checked first (every file listed in SHA256SUMS with its digest, none
# unlisted, the lock agreeing), then each step installs the lock's lines with --require-hashes
# --no-deps --no-index (pip takes no file whose hash the lock does not pin).  fairseq: DIR's prebuilt
# wheel where its record fits the venv (Python ABI, torch version, numpy major, platform, glibc and
# libstdc++: wheelhouse.py fits, run by the venv's python), else built from its sdist.  A torch already
# importable in the venv (a CUDA build) is kept, whatever its version: it is never replaced, not
# even by a torch in DIR.  --system-site-packages makes the venv see $PYTHON's packages (a GPU
# image's CUDA torch, numpy, transformers), also when $PYTHON is itself a venv's.  --dry-run prints
# the commands instead of running them.
set -euo pipefail
WHEELHOUSE="" DRY_RUN="" SYSTEM_SITE=""
while [ $# -gt 0 ]; do
    case "$1" in
    --wheelhouse)
        [ $# -ge 2 ] && [ -d "$2" ] || { echo "error: ${2:-DIR}: --wheelhouse needs an existing folder" >&2; exit 2; }
        WHEELHOUSE=$(cd "$2" && pwd); shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --system-site-packages) SYSTEM_SITE=1; shift ;;
    *) echo "error: $1: unknown option (setup_env.sh [--wheelhouse DIR [--system-site-packages] [--dry-run]])" >&2
       exit 2 ;;
    esac
done
for opt in ${DRY_RUN:+--dry-run} ${SYSTEM_SITE:+--system-site-packages}; do
    [ -n "$WHEELHOUSE" ] || { echo "error: $opt: only with --wheelhouse DIR" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ -n "$WHEELHOUSE" ]; then
    run() { if [ -n "$DRY_RUN" ]; then echo "+ $*"; else "$@"; fi; }
    # the wheelhouse's plan (WH_PYTHON, WH_TORCH, WH_FAIRSEQ, WH_BUILD, WH_LOCK_<STEP>: the lock's lines
    # of each step), after its files are checked; the standard library only
    PLAN_DIR=$(mktemp -d)
    trap 'rm -rf "$PLAN_DIR"' EXIT
    PLAN=$("$PY" scripts/wheelhouse.py check "$WHEELHOUSE" "$PLAN_DIR")
    eval "$PLAN"
    VPY="$VENV/bin/python"
    [ -x "$VPY" ] && HAVE="$VPY" || HAVE="$PY"
    HAVE_VERSION=$("$HAVE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$HAVE_VERSION" != "$WH_PYTHON" ]; then
        echo "error: $WHEELHOUSE: made for Python $WH_PYTHON, $HAVE is Python $HAVE_VERSION" >&2; exit 2
    fi
    if [ ! -x "$VPY" ] && [ -n "$SYSTEM_SITE" ]; then
        if ! run "$PY" -m venv --system-site-packages "$VENV"; then
            # no ensurepip (a Debian python without python3-venv): a venv without pip of its own, which
            # then runs $PYTHON's pip through the .pth below (pip installs into the interpreter running it)
            echo "venv: $PY cannot install pip into a venv; making one without, which uses $PY's pip"
            rm -rf "$VENV"
            run "$PY" -m venv --system-site-packages --without-pip "$VENV"
        fi
        # a venv made by a venv's python (a GPU image's /opt/.../.venv) sees the base interpreter's
        # packages, not that venv's: a .pth names $PYTHON's own site folders after the new venv's
        BASE_SITE=$("$PY" -c 'import site; print("\n".join(site.getsitepackages()))')
        PTH="$VENV/lib/python$WH_PYTHON/site-packages/_seed_fairseq_base_site.pth"
        if [ -n "$DRY_RUN" ]; then echo "+ write $PTH: $(echo $BASE_SITE)"; else echo "$BASE_SITE" > "$PTH"; fi
    elif [ ! -x "$VPY" ]; then
        run "$PY" -m venv "$VENV"
    fi
    export PIP_NO_INDEX=1
    PIP=("$VPY" -m pip install -q --no-index --find-links "$WHEELHOUSE" --require-hashes --no-deps)
    run "${PIP[@]}" --only-binary :all: -r "$WH_LOCK_BUILD"
    if [ -x "$VPY" ] && TORCH=$("$VPY" -c "import torch; print(torch.__version__)" 2>/dev/null); then
        echo "torch: keeping the installed torch $TORCH (never replaced)"
    elif [ -n "$WH_TORCH" ]; then
        run "${PIP[@]}" --only-binary :all: -r "$WH_LOCK_TORCH"
        # its version as the wheelhouse pins it: torch cannot be imported before the next step brings its
        # dependencies (every step is --no-deps)
        TORCH="${WH_TORCH#torch==}"
    else
        echo "error: $WHEELHOUSE: torch is not importable in $VENV and the wheelhouse has none" \
            "(install the machine's torch into $VENV first, or make the wheelhouse with --with-torch)" >&2
        exit 2
    fi
    # nothing below may change torch: a conflict fails instead of replacing it
    PIN="$VENV/torch-constraint.txt"
    if [ -n "$DRY_RUN" ]; then echo "+ echo torch==$TORCH > $PIN"; else echo "torch==$TORCH" > "$PIN"; fi
    run "${PIP[@]}" --only-binary :all: -c "$PIN" -r "$WH_LOCK_INSTALL"
    # fairseq: the wheelhouse's prebuilt wheel (scripts/device_bundle.sh builds one against the GPU image's
    # torch) only where it fits this venv: the same CPython ABI, torch.__version__ (its local label
    # included), numpy major and platform, a glibc and libstdc++ as new as its extensions need; checked
    # by the venv's own interpreter before anything is installed (wheelhouse.py fits). Else from its sdist,
    # built here against the torch above (--no-binary: never the wheel). fairseq compiles CUDA kernels of
    # generation code (libnat_cuda, ngram_repeat_block_cuda) when CUDA_HOME is set: minutes of nvcc
    # that text training never uses, so it is built without it
    BUILD_START=$SECONDS WHEEL_FITS="" WHY="the wheelhouse has no prebuilt wheel"
    if [ -n "$WH_FAIRSEQ_WHEEL" ]; then
        if [ ! -x "$VPY" ]; then
            WHY="the prebuilt wheel is not checked: no venv yet (--dry-run)"
        elif WHY=$("$VPY" scripts/wheelhouse.py fits "$WHEELHOUSE"); then
            WHEEL_FITS=1
        else
            WHY="the prebuilt wheel does not fit: ${WHY:-its check failed}"
        fi
    fi
    if [ -n "$WHEEL_FITS" ]; then
        echo "fairseq: the prebuilt $(basename "$WH_FAIRSEQ_WHEEL") fits ($WHY): installing it"
        run "${PIP[@]}" -c "$PIN" --only-binary :all: -r "$WH_LOCK_FAIRSEQ"
        [ -n "$DRY_RUN" ] || echo "fairseq: prebuilt wheel installed in $((SECONDS - BUILD_START)) s ($WHY)"
    else
        echo "fairseq: building from the sdist: $WHY"
        run env -u CUDA_HOME "${PIP[@]}" -c "$PIN" --no-build-isolation --no-binary :all: -r "$WH_LOCK_FAIRSEQ"
        [ -n "$DRY_RUN" ] || echo "fairseq: built and installed in $((SECONDS - BUILD_START)) s"
    fi
    # the plugin itself: nothing from the wheelhouse (no --find-links), no dependency
    run "$VPY" -m pip install -q --no-index --no-deps --no-build-isolation -c "$PIN" -e .
    # scikit-learn imported where fairseq uses it, not at every fairseq-train start (~1 s of 3.6)
    run "$VPY" -m seed_fairseq.pretrain.fairseq_patches.lazy_metrics
    # and fairseq's compiled data helpers (token blocks, batching), built here or prebuilt, load
    run "$VPY" -c "import fairseq, torch, seed_fairseq, fairseq.data.data_utils_fast, fairseq.data.token_block_utils_fast; print('fairseq', fairseq.__version__, '| torch', torch.__version__, '| seed_fairseq', seed_fairseq.__version__)"
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
# scikit-learn imported where fairseq uses it, not at every fairseq-train start (~1 s of 3.6)
"$VENV/bin/python" -m seed_fairseq.pretrain.fairseq_patches.lazy_metrics
"$VENV/bin/python" -c "import fairseq, torch, seed_fairseq; print('fairseq', fairseq.__version__, '| torch', torch.__version__, '| seed_fairseq', seed_fairseq.__version__)"
