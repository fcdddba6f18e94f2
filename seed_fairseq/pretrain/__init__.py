"""Pre-training with fairseq: the fairseq fixes, checkpoints, the save-dir lock, data, modules,
models, tasks, criterions, SimLM's generator and the validation diagnostics.

Imports ``base`` only (and fairseq).  Registered with fairseq by ``seed_fairseq.plugin``.
"""
