"""The pre-training tasks, one module per objective (``seed_fairseq.plugin`` imports every module here)."""
