#!/usr/bin/env python
"""Compare every bottleneck objective on identical data, encoder and budget.

    python examples/compare_objectives.py --out runs/compare                      # quick preset (<= 30 min, 2 cores)
    bash examples/data/get_debian_corpus.sh                                        # once, for the standard preset
    python examples/compare_objectives.py --preset standard --out runs/standard   # <= 3 h on 2 cores

Options: --objectives A,B (default: every objective of the plugin; --help lists them),
--seeds N, --init scratch|HF_DIR, --corpus FILE, --retrieval-data DIR, and every
size of the presets (--help).  The library is ``seed_fairseq.workflows.compare``; the
stages, outputs and resume rules are described in ``seed_fairseq/workflows/compare/pipeline.py``.
"""

import sys

from seed_fairseq.workflows.compare.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="examples/compare_objectives.py"))
