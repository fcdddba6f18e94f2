"""The objectives' tables for the docs, written from the registered objectives' descriptions.

    python scripts/objective_tables.py                   # every table, as Markdown
    python scripts/objective_tables.py comparison        # one of them
    python scripts/objective_tables.py --update-readme   # README.md's table, between its markers

The docs keep no hand-written table of the objectives: README.md holds the ``objectives`` table between
:data:`README_MARKERS`, written here and checked by tests/test_docs.py; the other pages point to the
script.  An objective added to the plugin is a row of every table without an edit anywhere
(``seed_fairseq/base/objectives.py`` says what each field is).
"""

import os
import re
from typing import Callable, Dict, List, Sequence

from .base.objectives import ObjectiveDescription
from .pretrain.tasks.registry import plugin_objectives


def _code(items: Sequence[str]) -> str:
    return ", ".join(f"`{x}`" for x in items)


def _short_paper(d: ObjectiveDescription) -> str:
    """"Lu et al., 'Title', EMNLP 2021" -> "Lu et al., EMNLP 2021", linked to the paper; "-" without one."""
    if not d.paper:
        return "-"
    parts = re.split(r"'[^']*'", d.paper)
    short = ", ".join(p.strip(" ,") for p in parts if p.strip(" ,"))
    return f"[{short}]({d.paper_url})" if d.paper_url else short


def _page(d: ObjectiveDescription, label: str, where: str) -> str:
    if not d.doc:
        return label
    return f"[{label}]({os.path.relpath(d.doc, os.path.dirname(where) or '.')})"


def _arch(d: ObjectiveDescription) -> str:
    return f"`{d.arch}`" + (f" + `{' '.join(d.args)}`" if d.args else "")


def objectives_table(ds: Sequence[ObjectiveDescription], where: str) -> List[str]:
    rows = [
        "| objective | paper | task = criterion | arch (full size; tiny) | pre-training heads | loss terms | page |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in ds:
        archs = _arch(d) + (f"; `{d.test_arch}`" if d.test_arch and d.test_arch != d.arch else "")
        heads = "; ".join(f"`{h}`" for h in d.heads)
        heads = f"{heads}: {d.heads_text}" if heads and d.heads_text else heads or d.heads_text
        rows.append(
            f"| {d.title} | {_short_paper(d)} | `{d.task}` | {archs} | {heads or 'none'} | {_code(d.terms)} | "
            f"{_page(d, d.title, where)} |"
        )
    return rows


def comparison_table(ds: Sequence[ObjectiveDescription], where: str) -> List[str]:
    rows = [
        "| `--objectives` | objective | task / criterion | arch | masking | what differs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for d in ds:
        if d.arch:
            rows.append(
                f"| `{d.comparison_name}` | {_page(d, d.label, where)} | `{d.task}` | {_arch(d)} | {d.masking} | "
                f"{d.notes} |"
            )
    return rows


TABLES: Dict[str, Callable[[Sequence[ObjectiveDescription], str], List[str]]] = {
    "objectives": objectives_table,
    "comparison": comparison_table,
}


def render(name: str, ds: Sequence[ObjectiveDescription] = None, where: str = "README.md") -> str:
    """Table ``name`` of the plugin's objectives (or of ``ds``), its links relative to the file ``where``."""
    return "\n".join(TABLES[name](plugin_objectives() if ds is None else ds, where))


README_MARKERS = ("<!-- objectives:begin -->", "<!-- objectives:end -->")


def readme_with_table(text: str) -> str:
    """``text`` (README.md) with the ``objectives`` table between :data:`README_MARKERS` written anew;
    ValueError when the markers are missing or out of order."""
    begin, end = README_MARKERS
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"README.md: the markers {begin} ... {end} are missing")
    return text[: start + len(begin)] + "\n" + render("objectives") + "\n" + text[stop:]
