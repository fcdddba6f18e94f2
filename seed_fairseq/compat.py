"""The 0.1 module of the fairseq fixes, kept for 0.1 code: importing it applies them, as in 0.1, and
``install()`` is 0.1's name for :func:`seed_fairseq.pretrain.fairseq_patches.apply` (the fixes, one
module each, and their table ``PATCHES`` live there)."""

from .pretrain.fairseq_patches import apply as install

install()
