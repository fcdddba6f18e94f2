"""Dense retrieval on top of exported SEED-Encoder checkpoints.

Modules: ``data`` (BEIR / MS MARCO loaders), ``search`` (encoding + faiss),
``metrics`` (ir_measures + paired permutation test), ``bm25`` (bm25s
baseline), ``finetune`` (DPR / ANCE style dual-encoder fine-tuning) and
``evaluate`` (search + metrics CLI).  See README.md in this folder.
"""
