"""The 0.1 name of ``seed_fairseq.encoders.drop_heads`` (``seed-drop-decoder``,
``python -m seed_fairseq.encoders.drop_decoder``)."""

import sys

from .drop_heads import drop_decoder, drop_heads, main, write_encoder_checkpoint  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
