#!/usr/bin/env python
"""The old name of examples/compare_objectives.py (same options; ``--models`` is ``--objectives``).

python examples/reproduce_small.py --out runs/reproduce_small
"""

import sys

from seed_fairseq.workflows.compare.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="examples/reproduce_small.py"))
