#!/usr/bin/env bash
# One command on a CUDA machine, no network: trains every objective at base shape in fp16
# (and bf16 where supported), checks precision, data parallelism, the HF export and faiss,
# and writes OUT/gpu_check.json and OUT/gpu_check.md (docs/gpu.md explains them).
#
#   bash scripts/gpu_check.sh --out gpu_check_out      # exit 1 when a check failed
#   bash scripts/gpu_check.sh --dry-run --out /tmp/gc  # the same checks on the CPU, tiny shape (CI)
#
# Python: $PYTHON, else the project's .venv (scripts/setup_env.sh), else python3.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
# the dry run: one thread per process (OpenMP spinning slows a shared machine down). Not on the GPU machine:
# the export's numeric check runs on its CPU (one thread there: over 80 s of the H200's first run, 2026-11-27)
for a in "$@"; do
  if [ "$a" = --dry-run ]; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi
done
exec "$PY" -m seed_fairseq.workflows.gpucheck "$@"
