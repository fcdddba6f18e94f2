"""0.1's head-dropping module, kept because 0.1 documented it (its README: ``python -m
seed_fairseq.drop_decoder CHECKPOINT OUT`` and ``seed_fairseq.drop_decoder.drop_decoder(state) -> state``).

Both run today's tool, ``seed_fairseq/encoders/drop_heads.py`` (``seed-drop-heads``; 0.1's command
``seed-drop-decoder`` runs it too): it drops whatever the model class declares pre-training-only, SEED's
weak decoder as in 0.1 and every other objective's heads.  The one module of the face that points
into a higher floor (tests/test_layers.py names it): 0.1's path, today's code.
"""

import sys

from .encoders.drop_heads import drop_heads as drop_decoder
from .encoders.drop_heads import main

__all__ = ["drop_decoder", "main"]

if __name__ == "__main__":
    sys.exit(main())
