#!/usr/bin/env bash
# The lent GPU machine in one call (docs/gpu.md, "The lent GPU machine"): an offline install from the
# device bundle (scripts/device_bundle.sh) into a venv that keeps the image's CUDA torch, fairseq built
# there (timed), then gpu_check under a time budget; everything the run measured lands in $OUT.
#
#   bash scripts/device_check.sh                      # on the lent machine: the device tool sets $OUT
#   bash scripts/device_check.sh --dry-run --out DIR  # the same on the CPU at tiny shape (the rehearsal)
#   bash scripts/device_check.sh --dry-run --no-install --out DIR   # the gpu_check part only, with $PYTHON (CI)
#
# Options: --bundle DIR (default: device_bundle), --out DIR (default: $OUT), --seconds N (the whole
# command ends within N seconds plus a few, whatever happens; default 480), --no-install (use $PYTHON,
# default .venv/bin/python, as it is), --data DIR (gpu_check's data set, a preprocess.build folder;
# default: the bundle's data/ when it has one, the Wikipedia sample with 32,768 pieces, else none:
# gpu_check builds the demo corpus, 16,384 pieces). $PYTHON is the image's interpreter (default
# /opt/torch/.venv/bin/python3, else python3); $DEVICE_VENV and $DEVICE_WORK the venv and gpu_check's
# scratch folder (defaults under /tmp). After `--`: gpu_check's own options (e.g. `-- --objectives
# simlm,cpdae`: a second call for what a first left out).
#
# At most 8 files in $OUT, no folder: device_check.txt (the summary: each step, its seconds and exit
# status), install.log, versions.txt, nvidia-smi.txt, gpu_check.json, gpu_check.md, gpu_check.log and,
# when a check crashed, tracebacks.log. Exit status: gpu_check's (0 passed, 1 a check failed, 3 some
# checks not run for lack of time, 128 + N interrupted), 4 when the install failed, 2 bad options.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
START=$(date +%s)
DRY_RUN="" INSTALL=1 BUNDLE="$ROOT/device_bundle" DEST=${OUT:-} TOTAL=480 DATA="" GPU_CHECK_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --no-install) INSTALL=""; shift ;;
    --bundle) [ $# -ge 2 ] || { echo "error: --bundle needs a folder" >&2; exit 2; }; BUNDLE=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "error: --out needs a folder" >&2; exit 2; }; DEST=$2; shift 2 ;;
    --data) [ $# -ge 2 ] || { echo "error: --data needs a folder" >&2; exit 2; }; DATA=$2; shift 2 ;;
    --seconds)
        [[ $# -ge 2 && "$2" =~ ^[0-9]+$ && "$2" -ge 60 ]] || { echo "error: --seconds ${2:-}: a whole number, 60 or more" >&2; exit 2; }
        TOTAL=$2; shift 2 ;;
    --) shift; GPU_CHECK_ARGS=("$@"); break ;;
    *) echo "error: $1: unknown option (device_check.sh [--dry-run] [--no-install] [--bundle DIR] [--data DIR] [--out DIR] [--seconds N] [-- GPU_CHECK_OPTIONS])" >&2
       exit 2 ;;
    esac
done
[ -n "$DEST" ] || { echo "error: no --out DIR and no \$OUT (the device tool sets it)" >&2; exit 2; }
# the install took 132 s on the lent H200 (fairseq's build 114 s) and once over 141 s; gpu_check needs 150 s
MIN_WITH_INSTALL=420
if [ -n "$INSTALL" ] && [ "$TOTAL" -lt "$MIN_WITH_INSTALL" ]; then
    echo "error: --seconds $TOTAL: at least $MIN_WITH_INSTALL with the install (it took 132-141+ s on the lent H200, gpu_check needs 150 s); --no-install with a ready \$PYTHON for less" >&2
    exit 2
fi
mkdir -p "$DEST" || { echo "error: $DEST: cannot be created" >&2; exit 2; }
DEST=$(cd "$DEST" && pwd)
if [ -n "$INSTALL" ]; then
    IMAGE_PY=${PYTHON:-}
    if [ -z "$IMAGE_PY" ]; then
        if [ -x /opt/torch/.venv/bin/python3 ]; then IMAGE_PY=/opt/torch/.venv/bin/python3; else IMAGE_PY=python3; fi
    fi
    [ -d "$BUNDLE" ] || { echo "error: $BUNDLE: no device bundle (make it with scripts/device_bundle.sh, carry it)" >&2; exit 2; }
    BUNDLE=$(cd "$BUNDLE" && pwd)
else
    IMAGE_PY=${PYTHON:-$ROOT/.venv/bin/python}
fi
# the check's data set: --data, else the bundle's (device_bundle.sh: the Wikipedia sample), else gpu_check builds one
[ -n "$DATA" ] || { [ -f "$BUNDLE/data/preprocess.json" ] && DATA="$BUNDLE/data"; }
VENV=${DEVICE_VENV:-/tmp/seed-fairseq-device-venv}
WORK=${DEVICE_WORK:-/tmp/seed-fairseq-device-work}
SUMMARY="$DEST/device_check.txt"
DEADLINE=$((START + TOTAL))
FINAL_RESERVE=20   # seconds kept for copying the report and writing the summary
left() { echo $((DEADLINE - $(date +%s))); }
note() { echo "$*" | tee -a "$SUMMARY"; }
: > "$SUMMARY"
note "device_check $(date -u +%Y-%m-%dT%H:%M:%SZ): ${DRY_RUN:+dry run on the CPU, }${INSTALL:+install from $BUNDLE, }within $TOTAL s"

# ---- the machine: nvidia-smi, versions -----------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
    timeout 30 nvidia-smi > "$DEST/nvidia-smi.txt" 2>&1
    note "nvidia-smi: exit $? ($(timeout 10 nvidia-smi -L 2>/dev/null | head -1))"
else
    echo "no nvidia-smi on this machine${DRY_RUN:+ (dry run on the CPU)}" > "$DEST/nvidia-smi.txt"
fi
{
    echo "== uname"; uname -a
    echo "== image python: $IMAGE_PY"; timeout 20 "$IMAGE_PY" -VV
    echo "== compilers"; for c in c++ g++ gcc nvcc ninja; do printf '%s: ' "$c"; ("$c" --version 2>/dev/null || echo none) | head -1; done
    echo "== Python.h"; timeout 20 "$IMAGE_PY" -c 'import os, sysconfig; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); print(h, "present" if os.path.exists(h) else "MISSING")'
    echo "== torch"; timeout 60 "$IMAGE_PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "| devices", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "| bf16", torch.cuda.is_available() and torch.cuda.is_bf16_supported())'
    echo "== pip list of the image"; timeout 60 "$IMAGE_PY" -m pip list --format=freeze 2>/dev/null
} > "$DEST/versions.txt" 2>&1
note "torch: $(grep -A1 '^== torch' "$DEST/versions.txt" | tail -1)"
if [ -n "$DATA" ]; then
    note "data: $DATA ($(grep -o '"vocab_size": [0-9]*' "$DATA/preprocess.json" 2>/dev/null | head -1 | grep -o '[0-9]*$' || echo '?') pieces; gpu_check --data checks it)"
else
    note "data: none in $BUNDLE: gpu_check builds the demo corpus"
fi

# ---- the install -------------------------------------------------------------------------------
if [ -n "$INSTALL" ]; then
    # the install may take all but 150 s of the whole: gpu_check needs at least that for a useful run
    LIMIT=$(( $(left) - 150 ))
    [ "$LIMIT" -ge 60 ] || LIMIT=60
    T0=$(date +%s)
    (
        export PYTHON="$IMAGE_PY" VENV="$VENV" PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
        export MAX_JOBS=${MAX_JOBS:-$(nproc)}   # torch's cpp_extension (ninja) compiles that many files at once
        unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_INDEX_URL PIP_EXTRA_INDEX_URL
        timeout -k 10 "$LIMIT" bash "$ROOT/scripts/setup_env.sh" --wheelhouse "$BUNDLE" --system-site-packages
    ) > "$DEST/install.log" 2>&1
    RC=$?
    T1=$(date +%s)
    BUILT=$(grep -o 'fairseq: built and installed in [0-9]* s' "$DEST/install.log" | tail -1)
    note "install: exit $RC in $((T1 - T0)) s (limit $LIMIT s); ${BUILT:-fairseq not built}"
    if [ "$RC" -ne 0 ]; then
        [ "$RC" -eq 124 ] && note "install: stopped at its time limit"
        tail -5 "$DEST/install.log" | sed 's/^/  | /' | tee -a "$SUMMARY"
        note "gpu_check: not run (the install failed); device_check ends with exit 4"
        exit 4
    fi
    timeout 60 "$VENV/bin/python" -m pip freeze --local > /dev/null 2>&1 \
        && { echo "== the venv's own packages ($VENV)"; "$VENV/bin/python" -m pip freeze --local 2>/dev/null; } >> "$DEST/versions.txt"
    PY="$VENV/bin/python"
else
    note "install: skipped (--no-install): $IMAGE_PY as it is"
    PY="$IMAGE_PY"
fi

# ---- gpu_check under the budget ----------------------------------------------------------------
BUDGET=$(( $(left) - FINAL_RESERVE ))
if [ "$BUDGET" -lt 60 ]; then
    note "gpu_check: not run: $BUDGET s left of the $TOTAL s"
    exit 3
fi
T0=$(date +%s)
# gpu_check ends itself inside its budget (every check has a deadline); SIGINT 10 s after it, SIGKILL
# 10 s later, whatever happens: its report is rewritten after every check, so even then one is left
PYTHON="$PY" timeout -s INT -k 10 $((BUDGET + 10)) bash "$ROOT/scripts/gpu_check.sh" ${DRY_RUN:+--dry-run} \
    ${DATA:+--data "$DATA"} --out "$WORK" --budget-seconds "$BUDGET" ${GPU_CHECK_ARGS[@]+"${GPU_CHECK_ARGS[@]}"} \
    > "$DEST/gpu_check.log" 2>&1
RC=$?
note "gpu_check: exit $RC in $(( $(date +%s) - T0 )) s (budget $BUDGET s)"
for f in gpu_check.json gpu_check.md; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$DEST/$f"
done
[ -s "$WORK/work/tracebacks.log" ] && cp "$WORK/work/tracebacks.log" "$DEST/tracebacks.log"
if [ -f "$DEST/gpu_check.md" ]; then
    note "report: $(head -1 "$DEST/gpu_check.md" | sed 's/^# //')"
    grep -m1 '^Data: ' "$DEST/gpu_check.md" | tee -a "$SUMMARY"
    grep -E '^(Failed|Not run)' "$DEST/gpu_check.md" | tee -a "$SUMMARY"
else
    note "report: none written (see gpu_check.log)"
fi
note "device_check: $(( $(date +%s) - START )) s in all"
exit "$RC"
