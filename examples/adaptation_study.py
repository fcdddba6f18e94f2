#!/usr/bin/env python
"""The adaptation study: every objective continued from one model on one domain, with and without
the safeguards, over seeds; zero-shot and after identical fine-tuning, against the original and BM25.

    python examples/adaptation_study.py --model HF_DIR --corpus TEXT --out OUT \\
        [--objectives all] [--arms none,safeguarded] [--seeds 1,2] [examples/adapt.py's options]

The library is ``seed_fairseq.workflows.adapt.study``; the design, the cost and the results are in
docs/adapt_study.md.
"""

import sys

from seed_fairseq.workflows.adapt.study import main

if __name__ == "__main__":
    sys.exit(main(prog="examples/adaptation_study.py"))
