"""``python -m seed_fairseq.workflows.gpucheck`` (what scripts/gpu_check.sh runs)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
