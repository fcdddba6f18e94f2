"""The pre-training criterions, one module per objective (``seed_fairseq.plugin`` imports every module here:
fairseq never auto-imports criterions from a user dir)."""
