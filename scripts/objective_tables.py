"""Print the objectives' tables, written from the registered objectives' descriptions
(``seed_fairseq/pretrain/tasks/tables.py``): the docs point here instead of keeping tables that
an objective added to the plugin would leave stale.

    python scripts/objective_tables.py               # every table
    python scripts/objective_tables.py comparison    # one of them
"""

import argparse
import sys

from seed_fairseq.pretrain.tasks.tables import TABLES, render


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="objective_tables.py", description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="*", help=f"any of {', '.join(TABLES)} (default: all)")
    args = p.parse_args(argv)
    unknown = [t for t in args.tables if t not in TABLES]
    if unknown:
        p.error(f"unknown table {', '.join(unknown)}; choose from {', '.join(TABLES)}")
    for name in args.tables or TABLES:
        print(f"## {name}\n\n{render(name)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
