#!/usr/bin/env python
"""Adapt a HuggingFace encoder to your domain, and show whether it helped.

    python examples/adapt.py --model HF_DIR --corpus TEXT --objective seed --out OUT \\
        [--retrieval-dev BEIR_DIR] [--train-queries BEIR_DIR]

Imports the model, continues its pre-training on TEXT with the objective (fresh heads
trained alone first), keeps the checkpoint that retrieves best on a held-out dev set,
exports it to OUT/model and writes OUT/report.md (+ report.json, report.png): retrieval
before and after, with paired p-values.  The library is ``seed_fairseq.workflows.adapt``; the
stages, outputs and resume rules are described in docs/adapt.md.
"""

import sys

from seed_fairseq.workflows.adapt.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="examples/adapt.py"))
