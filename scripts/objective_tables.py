"""Rewrite the docs' objective tables from the registered objectives' descriptions
(``seed_fairseq/tasks/tables.py`` says which tables and where).

    python scripts/objective_tables.py           # rewrite them
    python scripts/objective_tables.py --check   # exit 1 naming the files whose tables are stale
"""

import argparse
import sys

from seed_fairseq.tasks.tables import stale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="objective_tables.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is stale")
    args = p.parse_args(argv)
    changed = stale(write=not args.check)
    for where in changed:
        print(f"{where}: {'stale' if args.check else 'rewritten'}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
