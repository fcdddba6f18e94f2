"""Print the objectives' tables, written from the registered objectives' descriptions
(``seed_fairseq/objective_tables.py``), or write README.md's between its markers: the docs keep no
hand-written table an objective added to the plugin would leave stale.

    python scripts/objective_tables.py                   # every table
    python scripts/objective_tables.py comparison        # one of them
    python scripts/objective_tables.py --update-readme   # README.md's objectives table (tests/test_docs.py checks it)
"""

import argparse
import sys
from pathlib import Path

from seed_fairseq.base.fileio import write_text_atomic
from seed_fairseq.objective_tables import TABLES, readme_with_table, render

README = Path(__file__).resolve().parents[1] / "README.md"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="objective_tables.py", description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="*", help=f"any of {', '.join(TABLES)} (default: all)")
    p.add_argument("--update-readme", action="store_true", help="write README.md's objectives table")
    args = p.parse_args(argv)
    unknown = [t for t in args.tables if t not in TABLES]
    if unknown:
        p.error(f"unknown table {', '.join(unknown)}; choose from {', '.join(TABLES)}")
    if args.update_readme:
        try:
            write_text_atomic(README, readme_with_table(README.read_text(encoding="utf-8")))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote the objectives table into {README}")
        return 0
    for name in args.tables or TABLES:
        print(f"## {name}\n\n{render(name)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
