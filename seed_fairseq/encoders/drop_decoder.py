"""``drop_heads`` under its 0.1 name (0.1's ``seed_fairseq.drop_decoder``; the console script
``seed-drop-decoder`` runs :func:`seed_fairseq.encoders.drop_heads.main` directly)."""

import sys

from .drop_heads import drop_decoder, drop_heads, main, write_encoder_checkpoint  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
