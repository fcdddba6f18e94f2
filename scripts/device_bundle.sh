#!/usr/bin/env bash
# The device bundle: what the lent GPU machine's image lacks, for one offline install there
# (scripts/device_check.sh; docs/gpu.md, "The lent GPU machine"). Run where the package index is
# reachable, with the project's .venv set up (scripts/setup_env.sh):
#
#   bash scripts/device_bundle.sh [--wiki FILE] [--image-python PY | --no-prebuilt] [OUT_DIR]
#                                               # OUT_DIR default: device_bundle (git-ignored, carried)
#
# A wheelhouse (scripts/wheelhouse.py) for Python 3.12 / manylinux x86_64: fairseq-fixed's sdist and the
# wheel built from it here (below), antlr4's sdist and the wheel built from it, wheels of hydra-core, omegaconf,
# bitarray, cffi and whatever else the project (with its hf extra) and fairseq need at run time that
# the image lacks, and setuptools/wheel for the build; SHA256SUMS and a hashed lock. Never: what
# scripts/device_image.txt lists (torch, numpy, transformers ... are the image's), faiss (26 MB, no
# CUDA 13 build on PyPI: gpu_check's faiss check says it is not installed) and blingfire (40 MB; only
# sentence splitting needs it, and gpu_check builds its data one paragraph per line).
# The check's data set, under data/ (hashed in SHA256SUMS like the rest, never installed): a
# preprocess.build folder of the Wikipedia sample (--wiki FILE, default
# ../shared/data/enwiki-sample-206-pages.xml.bz2 beside the checkout; CC BY-SA, never committed) with a
# 32,768-piece vocabulary, one paragraph per line; device_check.sh passes it to gpu_check (--data).
# Built here (~15 s, 2.6 MB): the device keeps its minutes for the checks. Without the sample this
# says so, the bundle has no data/, and gpu_check builds the demo corpus there (16,384 pieces).
# fairseq's wheel: built here with the image venv's python (scripts/image_venv.sh: torch 2.11.0+cu130, numpy
# 2.5.2, cython, Python 3.12, as the image has them) by setup_env.sh's own fairseq step, offline, and recorded
# (what it was built against, the glibc and libstdc++ its extensions need); ~2.5 min on 2 cores, 21 MB. The
# device installs it only where its torch, numpy, Python and platform match the record and its glibc and
# libstdc++ are new enough (scripts/wheelhouse.py fits), else builds the sdist (114-170 s there). The image
# venv: --image-python PY, else $SEED_IMAGE_PYTHON, else ~/.cache/seed_fairseq/image-py312/bin/python when
# it is there; without one (or with --no-prebuilt) the bundle carries the sdist alone, and this says the
# device will build fairseq.
# The interpreter that downloads the wheels is a Python 3.12: $PYTHON312, else python3.12 on PATH,
# else pyenv's. Ctrl-C, SIGTERM or SIGHUP stop the maker's whole tree (pip, preprocess.build's workers,
# fairseq's wheel build and its compilers) before this script ends with 128 + N: OUT_DIR is whole or as it
# was (the maker builds beside it and replaces it only when complete; a maker that is gone replaces nothing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="" WIKI="" WIKI_GIVEN="" IMAGE_PY=${SEED_IMAGE_PYTHON:-} IMAGE_GIVEN=${SEED_IMAGE_PYTHON:+1} PREBUILT=1
while [ $# -gt 0 ]; do
    case "$1" in
    --wiki) [ $# -ge 2 ] || { echo "error: --wiki needs a file" >&2; exit 2; }; WIKI=$2 WIKI_GIVEN=1; shift 2 ;;
    --image-python) [ $# -ge 2 ] && [ -n "$2" ] || { echo "error: --image-python needs an interpreter" >&2; exit 2; }
        IMAGE_PY=$2 IMAGE_GIVEN=1; shift 2 ;;
    --no-prebuilt) PREBUILT=""; shift ;;
    -*) echo "error: $1: unknown option (device_bundle.sh [--wiki FILE] [--image-python PY | --no-prebuilt] [OUT_DIR])" >&2
        exit 2 ;;
    *) [ -z "$OUT" ] || { echo "error: $1: one OUT_DIR only" >&2; exit 2; }; OUT=$1; shift ;;
    esac
done
OUT=${OUT:-$ROOT/device_bundle}
WIKI=${WIKI:-$ROOT/../shared/data/enwiki-sample-206-pages.xml.bz2}
if [ -n "$WIKI_GIVEN" ] && [ ! -f "$WIKI" ]; then echo "error: $WIKI: --wiki: no such file" >&2; exit 2; fi
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
# the image venv that builds fairseq's wheel: one named must be a Python 3.12 (wheelhouse.py then checks
# that it imports torch, before anything is downloaded); the cached one is used when it is one
PREBUILD=()
if [ -z "$PREBUILT" ]; then
    FAIRSEQ_NOTE="sdist only (--no-prebuilt): the device will build fairseq (114-170 s of its 480)"
elif [ -n "$IMAGE_GIVEN" ]; then
    is312 "$IMAGE_PY" || { echo "error: $IMAGE_PY: --image-python (or \$SEED_IMAGE_PYTHON): not a Python 3.12 (scripts/image_venv.sh makes one)" >&2; exit 2; }
    PREBUILD=(--prebuild-python "$IMAGE_PY")
else
    IMAGE_PY=$HOME/.cache/seed_fairseq/image-py312/bin/python
    if is312 "$IMAGE_PY"; then
        PREBUILD=(--prebuild-python "$IMAGE_PY")
    else
        FAIRSEQ_NOTE="sdist only: no image venv (scripts/image_venv.sh, or --image-python PY) to build its wheel with: the device will build fairseq (114-170 s of its 480)"
    fi
fi
# Each maker runs in the background under `timeout` with no time limit (0): timeout gives it a process
# group of its own, passes a signal to that whole group and kills the group 10 s later (-k). In the
# background, a trapped signal ends `wait` at once; in the foreground, bash would end on SIGTERM and
# leave the maker to finish and replace OUT_DIR seconds later. The maker gets SIGTERM whatever this
# script got: wheelhouse.py unwinds on it (its staging folder removed), where SIGHUP would end it at once.
# fd 3 keeps this script's stderr for the trap, which may run while a child's stderr is redirected.
exec 3>&2
CHILD=""
child() { timeout -k 10 0 "$@" 3>&- & CHILD=$!; wait "$CHILD"; }
interrupted() {   # $1: INT, TERM or HUP
    trap '' INT TERM HUP PIPE   # nothing breaks off the stopping: not a second signal, not a reader gone
    if [ -n "$CHILD" ]; then
        kill -s TERM "$CHILD" 2>/dev/null || true
        for _ in $(seq 75); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.2; done   # 15 s whatever happens
        kill -s KILL -- "-$CHILD" 2>/dev/null || true   # what is left of its group
        wait "$CHILD" 2>/dev/null || true
    fi
    echo "device_bundle: interrupted (SIG$1): the maker is stopped; $OUT is whole or as it was" >&3
    exit $((128 + $(kill -l "$1")))
}
for sig in INT TERM HUP; do trap "interrupted $sig" "$sig"; done
DATA=()
if [ -f "$WIKI" ]; then
    WIKI=$(cd "$(dirname "$WIKI")" && pwd)/$(basename "$WIKI")   # as preprocess.json records it
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    echo "data: preprocess.build of $WIKI, 32768 pieces"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} child "$PY" -m preprocess.build --wiki "$WIKI" --out "$TMP/data" --vocab-size 32768 \
        --valid-docs 3 --test-docs 2 --line-unit paragraph --workers 1 2> "$TMP/build.log" \
        || { tail -5 "$TMP/build.log" >&2; exit 2; }
    DATA=(--data "$TMP/data")
else
    echo "data: none: no Wikipedia sample at $WIKI; gpu_check will build the demo corpus on the device (16,384 pieces)"
fi
[ ${#PREBUILD[@]} -eq 0 ] || echo "fairseq: its wheel built here with the image venv $IMAGE_PY (as setup_env.sh builds it on the device, offline)"
child "$PY" "$ROOT/scripts/wheelhouse.py" make --python 3.12 --platform manylinux_2_28_x86_64 --extras hf \
    --image "$ROOT/scripts/device_image.txt" --leave-out blingfire --download-python "$PY312" "${DATA[@]}" \
    "${PREBUILD[@]}" --out "$OUT"
[ ${#PREBUILD[@]} -gt 0 ] || echo "fairseq: $FAIRSEQ_NOTE"
echo "device bundle $OUT: $(du -sh --apparent-size "$OUT" | cut -f1) in $(find "$OUT" -type f | wc -l) files${DATA[*]:+, data/ included}${PREBUILD[*]:+, fairseq prebuilt}"
