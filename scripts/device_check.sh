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
# command ends within N seconds plus a few, whatever happens; default 480, at most 570, 3600 with --dry-run),
# --no-install (use $PYTHON, default .venv/bin/python, as it is), --data DIR (gpu_check's data set, a
# preprocess.build folder; default: the bundle's data/ when it has one, the Wikipedia sample with 32,768
# pieces, else none: gpu_check builds the demo corpus, 16,384 pieces). $PYTHON is the image's interpreter
# (default /opt/torch/.venv/bin/python3, else python3); $DEVICE_VENV and $DEVICE_WORK the venv and
# gpu_check's scratch folder (default: venv/ and work/ in ${TMPDIR:-/tmp}/seed-fairseq-device-UID, this
# user's folder of mode 0700, made by the first run and reused by the next). After `--`: gpu_check's own
# options (e.g. `-- --objectives simlm,cpdae`: a second call for what a first left out; `-- --no-profile`:
# no kernel profile, which is on by default and gives way to the time budget by itself).
#
# At most 8 files in $OUT, no folder: device_check.txt (the summary: each step, its seconds and exit
# status), install.log, versions.txt, nvidia-smi.txt, gpu_check.json, gpu_check.md, gpu_check.log and,
# when a check crashed, tracebacks.log. Exit status: gpu_check's (0 passed, 1 a check failed, 3 some
# checks not run for lack of time, 128 + N interrupted), 4 when the install failed, 2 bad options (one
# `error:` line, before anything is written), 128 + N when this script gets signal N (Ctrl-C, SIGTERM,
# SIGHUP): it stops the running step's whole tree, copies the report gpu_check left and says
# "interrupted" in device_check.txt.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
START=$(date +%s)
DRY_RUN="" INSTALL=1 BUNDLE="$ROOT/device_bundle" DEST=${OUT:-} TOTAL=480 SECONDS_GIVEN="" DATA="" GPU_CHECK_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --no-install) INSTALL=""; shift ;;
    --bundle) [ $# -ge 2 ] || { echo "error: --bundle needs a folder" >&2; exit 2; }; BUNDLE=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "error: --out needs a folder" >&2; exit 2; }; DEST=$2; shift 2 ;;
    --data) [ $# -ge 2 ] || { echo "error: --data needs a folder" >&2; exit 2; }; DATA=$2; shift 2 ;;
    --seconds) [ $# -ge 2 ] || { echo "error: --seconds needs a number" >&2; exit 2; }; SECONDS_GIVEN=$2; shift 2 ;;
    --) shift; GPU_CHECK_ARGS=("$@"); break ;;
    *) echo "error: $1: unknown option (device_check.sh [--dry-run] [--no-install] [--bundle DIR] [--data DIR] [--out DIR] [--seconds N] [-- GPU_CHECK_OPTIONS])" >&2
       exit 2 ;;
    esac
done
# The device tool runs one command for at most 600 s and kills it then: a longer --seconds could never be
# used there, gpu_check would plan checks for time that does not exist. 30 s of the 600 are kept for what
# runs past the deadline (the report's copy) and the tool's own stopping. The dry run is the CPU
# rehearsal's, which needs 1200 s on 2 shared cores (its test allows an hour).
if [ -n "$DRY_RUN" ]; then MAX_SECONDS=3600 WHY="with --dry-run"; else MAX_SECONDS=570 WHY="the device tool stops a command at 600 s"; fi
if [ -n "$SECONDS_GIVEN" ]; then
    # read as decimal (bash arithmetic takes 0480 for octal) and only up to 5 digits (it wraps at 2^63)
    if [[ "$SECONDS_GIVEN" =~ ^0*([0-9]{1,5})$ ]]; then TOTAL=$((10#${BASH_REMATCH[1]})); else TOTAL=-1; fi
    if [ "$TOTAL" -lt 60 ] || [ "$TOTAL" -gt "$MAX_SECONDS" ]; then
        echo "error: --seconds $SECONDS_GIVEN: a whole number from 60 to $MAX_SECONDS ($WHY)" >&2
        exit 2
    fi
fi
[ -n "$DEST" ] || { echo "error: no --out DIR and no \$OUT (the device tool sets it)" >&2; exit 2; }
# the install took 132 s on the lent H200 (fairseq's build 114 s) and once over 141 s; gpu_check needs 150 s
MIN_WITH_INSTALL=420
if [ -n "$INSTALL" ] && [ "$TOTAL" -lt "$MIN_WITH_INSTALL" ]; then
    echo "error: --seconds $TOTAL: at least $MIN_WITH_INSTALL with the install (it took 132-141+ s on the lent H200, gpu_check needs 150 s); --no-install with a ready \$PYTHON for less" >&2
    exit 2
fi
if [ -n "$INSTALL" ]; then
    [ -d "$BUNDLE" ] || { echo "error: $BUNDLE: no device bundle (make it with scripts/device_bundle.sh, carry it)" >&2; exit 2; }
    BUNDLE=$(cd "$BUNDLE" && pwd)
fi
[ -z "$DATA" ] || [ -d "$DATA" ] || { echo "error: $DATA: --data: no such folder (the --out of python -m preprocess.build)" >&2; exit 2; }
# The venv and gpu_check's scratch folder, unless $DEVICE_VENV / $DEVICE_WORK name them: in one folder of
# this user's, mode 0700, made by the first run and reused by the next (a second call on the warm machine
# runs the first call's venv). /tmp is everyone's: a path someone else made there first (a folder, a link)
# would have this run execute their python and write into their folder, so it is refused.
OWN=${TMPDIR:-/tmp}/seed-fairseq-device-$(id -u)
if { [ -n "$INSTALL" ] && [ -z "${DEVICE_VENV:-}" ]; } || [ -z "${DEVICE_WORK:-}" ]; then
    mkdir -m 700 "$OWN" 2>/dev/null
    if [ -L "$OWN" ] || [ ! -d "$OWN" ] || [ ! -O "$OWN" ] || [ "$(stat -c %a "$OWN")" != 700 ]; then
        echo "error: $OWN: not a folder of this user's with mode 0700 (someone else's, or a link): remove it, or set DEVICE_VENV and DEVICE_WORK" >&2
        exit 2
    fi
fi
VENV=${DEVICE_VENV:-$OWN/venv}
WORK=${DEVICE_WORK:-$OWN/work}
mkdir -p "$DEST" || { echo "error: $DEST: cannot be created" >&2; exit 2; }
DEST=$(cd "$DEST" && pwd)
if [ -n "$INSTALL" ]; then
    IMAGE_PY=${PYTHON:-}
    if [ -z "$IMAGE_PY" ]; then
        if [ -x /opt/torch/.venv/bin/python3 ]; then IMAGE_PY=/opt/torch/.venv/bin/python3; else IMAGE_PY=python3; fi
    fi
else
    IMAGE_PY=${PYTHON:-$ROOT/.venv/bin/python}
fi
# the check's data set: --data, else the bundle's (device_bundle.sh: the Wikipedia sample), else gpu_check builds one
[ -n "$DATA" ] || { [ -f "$BUNDLE/data/preprocess.json" ] && DATA="$BUNDLE/data"; }
SUMMARY="$DEST/device_check.txt"
DEADLINE=$((START + TOTAL))
FINAL_RESERVE=20   # seconds kept for copying the report and writing the summary
left() { echo $((DEADLINE - $(date +%s))); }
note() { echo "$*" | tee -a "$SUMMARY"; }

# ---- signals: every step's whole tree stops, what exists is copied --------------------------------
# Every child runs in the background under `timeout`, which gives it a process group of its own, passes
# a signal it gets to that whole group and kills the group -k seconds later. Its group is not the
# terminal's foreground group, so Ctrl-C reaches this script alone, which passes it on (before, the run
# went on to the end); in the background, a trapped signal ends `wait` at once, where a foreground child
# would hold the trap until it ended (and bash, killed by SIGTERM, would leave it running). fds 3 and 4
# keep this script's output for the trap, which may run inside a redirected block; children get neither.
exec 3>&1 4>&2
CHILD="" STEP="the machine step" GPU_CHECK_STARTED=""
child() { "$@" 3>&- 4>&- & CHILD=$!; wait "$CHILD"; local rc=$?; CHILD=""; return "$rc"; }
interrupted() {   # $1: INT, TERM or HUP
    # nothing breaks off the stopping: not a second signal, not a reader of our output that is gone
    trap '' INT TERM HUP PIPE
    exec 1>&3 2>&4
    if [ -n "$CHILD" ]; then
        kill -s "$1" "$CHILD" 2>/dev/null
        # timeout kills the group 10 s after passing the signal on (gpu_check stops its trainers, in
        # groups of their own, and writes its report within them); 15 s whatever happens
        for _ in $(seq 75); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.2; done
        kill -s KILL -- "-$CHILD" 2>/dev/null   # what is left of its group
        wait "$CHILD" 2>/dev/null
    fi
    [ -z "$GPU_CHECK_STARTED" ] || copy_report   # before it, a report in the scratch folder is an earlier run's
    note "device_check: interrupted (SIG$1) during $STEP, after $(( $(date +%s) - START )) s; exit $((128 + $(kill -l "$1")))"
    exit $((128 + $(kill -l "$1")))
}
copy_report() {   # the report gpu_check left in its scratch folder: into $OUT, its verdict into the summary
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
}
: > "$SUMMARY"
for sig in INT TERM HUP; do trap "interrupted $sig" "$sig"; done
note "device_check $(date -u +%Y-%m-%dT%H:%M:%SZ): ${DRY_RUN:+dry run on the CPU, }${INSTALL:+install from $BUNDLE, }within $TOTAL s"

# ---- the machine: nvidia-smi, versions -----------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
    child timeout -k 5 30 nvidia-smi > "$DEST/nvidia-smi.txt" 2>&1
    RC=$?
    child timeout -k 5 10 nvidia-smi -L >> "$DEST/nvidia-smi.txt" 2>&1
    note "nvidia-smi: exit $RC ($(grep -m1 '^GPU 0' "$DEST/nvidia-smi.txt"))"
else
    echo "no nvidia-smi on this machine${DRY_RUN:+ (dry run on the CPU)}" > "$DEST/nvidia-smi.txt"
fi
{
    echo "== uname"; uname -a
    echo "== image python: $IMAGE_PY"; child timeout -k 5 20 "$IMAGE_PY" -VV
    echo "== compilers"; for c in c++ g++ gcc nvcc ninja; do printf '%s: ' "$c"; ("$c" --version 2>/dev/null || echo none) | head -1; done
    echo "== Python.h"; child timeout -k 5 20 "$IMAGE_PY" -c 'import os, sysconfig; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); print(h, "present" if os.path.exists(h) else "MISSING")'
    echo "== torch"; child timeout -k 5 60 "$IMAGE_PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "| devices", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "| bf16", torch.cuda.is_available() and torch.cuda.is_bf16_supported())'
    echo "== pip list of the image"; child timeout -k 5 60 "$IMAGE_PY" -m pip list --format=freeze 2>/dev/null
} > "$DEST/versions.txt" 2>&1
note "torch: $(grep -A1 '^== torch' "$DEST/versions.txt" | tail -1)"
if [ -n "$DATA" ]; then
    note "data: $DATA ($(grep -o '"vocab_size": [0-9]*' "$DATA/preprocess.json" 2>/dev/null | head -1 | grep -o '[0-9]*$' || echo '?') pieces; gpu_check --data checks it)"
else
    note "data: none in $BUNDLE: gpu_check builds the demo corpus"
fi

# ---- the install -------------------------------------------------------------------------------
if [ -n "$INSTALL" ]; then
    STEP="the install"
    # the install may take all but 150 s of the whole: gpu_check needs at least that for a useful run
    LIMIT=$(( $(left) - 150 ))
    [ "$LIMIT" -ge 60 ] || LIMIT=60
    run_install() {   # in the background subshell `child` starts: the exports are the install's alone
        export PYTHON="$IMAGE_PY" VENV="$VENV" PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
        export MAX_JOBS=${MAX_JOBS:-$(nproc)}   # torch's cpp_extension (ninja) compiles that many files at once
        unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_INDEX_URL PIP_EXTRA_INDEX_URL
        exec timeout -k 10 "$LIMIT" bash "$ROOT/scripts/setup_env.sh" --wheelhouse "$BUNDLE" --system-site-packages
    }
    T0=$(date +%s)
    child run_install > "$DEST/install.log" 2>&1
    RC=$?
    T1=$(date +%s)
    # setup_env.sh's fairseq line: the bundle's prebuilt wheel (what it was built against), or the sdist built
    BUILT=$(grep -oE 'fairseq: (built and installed in [0-9]+ s|prebuilt wheel installed in [0-9]+ s \([^)]*\))' "$DEST/install.log" | tail -1)
    note "install: exit $RC in $((T1 - T0)) s (limit $LIMIT s) into $VENV; ${BUILT:-fairseq not installed}"
    # why it was built rather than the prebuilt wheel installed, when it was
    grep -m1 '^fairseq: building from the sdist: ' "$DEST/install.log" | tee -a "$SUMMARY"
    if [ "$RC" -ne 0 ]; then
        [ "$RC" -eq 124 ] && note "install: stopped at its time limit"
        tail -5 "$DEST/install.log" | sed 's/^/  | /' | tee -a "$SUMMARY"
        note "gpu_check: not run (the install failed); device_check ends with exit 4"
        exit 4
    fi
    { echo "== the venv's own packages ($VENV)"; child timeout -k 5 60 "$VENV/bin/python" -m pip freeze --local 2>/dev/null; } \
        >> "$DEST/versions.txt"
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
STEP="gpu_check" GPU_CHECK_STARTED=1
T0=$(date +%s)
# gpu_check ends itself inside its budget (every check has a deadline); SIGINT 10 s after it, SIGKILL
# 10 s later, whatever happens: its report is rewritten after every check, so even then one is left
child env PYTHON="$PY" timeout -s INT -k 10 $((BUDGET + 10)) bash "$ROOT/scripts/gpu_check.sh" ${DRY_RUN:+--dry-run} \
    ${DATA:+--data "$DATA"} --out "$WORK" --budget-seconds "$BUDGET" ${GPU_CHECK_ARGS[@]+"${GPU_CHECK_ARGS[@]}"} \
    > "$DEST/gpu_check.log" 2>&1
RC=$?
note "gpu_check: exit $RC in $(( $(date +%s) - T0 )) s (budget $BUDGET s)"
copy_report
note "device_check: $(( $(date +%s) - START )) s in all"
exit "$RC"
