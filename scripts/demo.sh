#!/usr/bin/env bash
# The main job on a fresh machine, with no download: set up the environment,
# turn the embedded real-text corpus (examples/data/demo_corpus.txt) into
# binarized data, pre-train a small SEED-Encoder (MLM + 3-layer k=2 weak
# decoder) on the CPU with the real fairseq-train, and drop the decoder.
#
#   bash scripts/demo.sh                 # ~5 min after set-up on 2 cores (300 updates)
#   UPDATES=2000 OUT=runs/x bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
OUT=${OUT:-demo_output}
UPDATES=${UPDATES:-300}
PY=.venv/bin/python
# one thread per process: OpenMP spinning makes a shared 2-core machine many times slower
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

"$PY" -m preprocess.build --text examples/data/demo_corpus.txt --out "$OUT/data-bin" \
  --vocab-size 2000 --workers 2 --valid-docs 4 --test-docs 4

.venv/bin/fairseq-train "$OUT/data-bin" --user-dir seed_fairseq \
  --task seed_pretrain --criterion seed_pretrain --arch seed_encoder_tiny \
  --tokens-per-sample 128 --batch-size 16 --update-freq 1 \
  --optimizer torch_adam --adam-betas '(0.9,0.999)' --adam-eps 1e-6 --weight-decay 0.01 \
  --lr 5e-4 --lr-scheduler polynomial_decay --warmup-updates 30 --total-num-update "$UPDATES" \
  --clip-norm 1.0 --dropout 0.1 --attention-dropout 0.1 \
  --max-update "$UPDATES" --validate-interval-updates 100 --save-interval-updates 100 \
  --keep-interval-updates 1 --no-epoch-checkpoints --skip-invalid-size-inputs-valid-test \
  --save-dir "$OUT/checkpoints" --tensorboard-logdir "$OUT/tensorboard" \
  --log-format simple --log-interval 50 --cpu --flush-denormal --seed 1

.venv/bin/seed-drop-heads "$OUT/checkpoints/checkpoint_last.pt" "$OUT/encoder.pt"
echo "done: checkpoints in $OUT/checkpoints, encoder-only RoBERTa checkpoint $OUT/encoder.pt, tensorboard logs in $OUT/tensorboard"
