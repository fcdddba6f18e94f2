"""Dense retrieval on top of exported SEED-Encoder checkpoints.

Modules: ``data`` (BEIR / MS MARCO loaders), ``search`` (encoding + faiss),
``metrics`` (ir_measures + paired permutation test), ``bm25`` (bm25s
baseline), ``finetune`` (DPR / ANCE style dual-encoder fine-tuning) and
``evaluate`` (search + metrics CLI); ``common`` holds what they share (the
project's atomic-write and output-ownership helpers, argparse types, the
one-line ``error:`` report).  See README.md in this folder.
"""
