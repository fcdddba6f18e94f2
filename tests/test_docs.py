"""The documentation's links hold: every relative link of every Markdown file of the repository reaches
an existing file (and, with ``#anchor``, a heading of it); README.md stays a README and keeps the two
commands CI and the demo read."""

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Folders that are not the project's documents: tools, environments, build and run outputs (.gitignore).
SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules", "work_dirs", "demo_output", "runs"}
SKIP_PATHS = {Path("examples/data/debian")}

TEST_COMMAND = (
    "bash scripts/setup_env.sh && .venv/bin/ruff check . "
    "&& .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal tests"
)
DEMO_COMMAND = "bash scripts/demo.sh"
README_MAX_LINES = 260

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the text may hold one level of brackets ("![[CLS] cosine](x.png)").
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files(root=REPO):
    """Every .md file under root, outside hidden folders (.git, .venv, ...) and build or run outputs."""
    found = []
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and rel / d not in SKIP_PATHS
        )
        found += [Path(folder) / f for f in sorted(files) if f.endswith(".md")]
    return found


def outside_fences(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with inline code spans blanked to ``code``."""
    for number, line in outside_fences(text):
        yield number, CODE_SPAN.sub("code", line)


def slug(heading):
    """GitHub's anchor for a heading: the text (links reduced to their text), lower case, punctuation
    other than hyphens, underscores and spaces dropped, spaces to hyphens."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a Markdown file: heading slugs (a repeated slug gets -1, -2, ...) and HTML anchors."""
    seen = {}
    found = set()
    for _, line in outside_fences(path.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_targets(path):
    """(line number, target) of every inline link, image and reference definition of a Markdown file."""
    previous = ""
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1).strip("<>")
        m = REFERENCE_DEF.match(line)
        if m and not previous.strip():  # a definition cannot continue a paragraph ("[CLS]: tested.")
            yield number, m.group(1).strip("<>")
        previous = line


def broken_links(path, root=REPO):
    """'FILE:LINE: target: problem' for every relative link of path that does not resolve."""
    problems = []
    anchor_cache = {}
    for number, target in link_targets(path):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # http(s), mailto, ...: not checked here
        where = f"{path.relative_to(root)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        if file_part:
            base = root if file_part.startswith("/") else path.parent
            resolved = (base / file_part.lstrip("/")).resolve()
            if not resolved.is_relative_to(root.resolve()):
                problems.append(f"{where}: points outside the repository")
                continue
            if not resolved.exists():
                problems.append(f"{where}: no such file")
                continue
        else:
            resolved = path
        if anchor and resolved.suffix == ".md":
            if resolved not in anchor_cache:
                anchor_cache[resolved] = anchors(resolved)
            if anchor not in anchor_cache[resolved]:
                problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.relative_to(root)}")
    return problems


MARKDOWN = markdown_files()


def test_the_walk_finds_the_documents():
    names = {p.relative_to(REPO).as_posix() for p in MARKDOWN}
    assert {"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/guarantees.md"} <= names
    assert not any(n.startswith((".venv/", ".git/")) for n in names)


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_readme_is_a_readme():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the manual belongs in docs/"
    # CI (.ci/run) and the demo instructions read these lines verbatim.
    assert TEST_COMMAND in lines
    assert DEMO_COMMAND in lines


def test_ci_runs_the_readmes_test_command():
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_slugs_follow_github():
    assert slug("Pre-training: the paper's configuration") == "pre-training-the-papers-configuration"
    assert slug("Export to HuggingFace transformers / sentence-transformers") == (
        "export-to-huggingface-transformers--sentence-transformers"
    )
    assert slug("On the CPU: `--flush-denormal`") == "on-the-cpu---flush-denormal"
    assert slug("Dense retrieval (seed_fairseq.retrieval)") == "dense-retrieval-seed_fairseqretrieval"
    assert slug("See [the docs](docs/x.md)") == "see-the-docs"


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Part\n\n## Part\n", encoding="utf-8")
    (tmp_path / "b.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#part-1) [ok](#here) ![ok](docs/) [web](https://x.invalid/y)\n"
        "# Here\n"
        "```\n[in code](missing.md)\n```\n"
        "`[in a span](missing.md)`\n"
        "[gone](docs/missing.md) ![[nested] gone](img.png) [bad anchor](docs/a.md#part-2)\n"
        "[self](#nowhere) [out](../outside.md)\n"
        "[CLS]: not a definition.\n\n[ref]: docs/nothing.md\n",
        encoding="utf-8",
    )
    problems = broken_links(tmp_path / "b.md", root=tmp_path)
    assert [p.split(": ")[1] for p in problems] == [
        "docs/missing.md",
        "img.png",
        "docs/a.md#part-2",
        "#nowhere",
        "../outside.md",
        "docs/nothing.md",
    ]



def test_the_readmes_objectives_table_is_the_generated_one():
    """README.md shows the objectives' table, written between its markers from the descriptions."""
    from seed_fairseq.objective_tables import README_MARKERS, readme_with_table

    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme_with_table(text) == text, "stale: python scripts/objective_tables.py --update-readme"
    stale = text.replace("| `bowpred_pretrain` |", "| `bow_pretrain` |")
    assert readme_with_table(stale) == text  # what the check compares with is the descriptions', not the file's
    with pytest.raises(ValueError, match="markers"):
        readme_with_table(text.replace(README_MARKERS[0], ""))


def test_adapts_list_of_objectives_is_every_objective():
    """docs/adapt.md names --objective's values in prose: every one the comparison's table has, no other."""
    import re

    from seed_fairseq.workflows.kit.objectives import ORDER

    text = " ".join((REPO / "docs" / "adapt.md").read_text(encoding="utf-8").split())
    listed = re.search(r"`--objective` is one of (.*?) \(", text)
    assert listed and re.findall(r"`([^`]+)`", listed.group(1)) == list(ORDER)


def test_every_objective_is_a_row_of_every_table():
    """The objectives' tables (``scripts/objective_tables.py``; the docs point to it) are written from the
    descriptions: one row per objective, a new description is a new row, its page linked."""
    import dataclasses

    from seed_fairseq.objective_tables import TABLES, render
    from seed_fairseq.pretrain.tasks.registry import plugin_objectives

    described = plugin_objectives()
    new = dataclasses.replace(
        described[0], name="novel", compare_name="", title="Novel", label="Novel objective", doc="docs/x.md"
    )
    for name in TABLES:
        before = render(name).splitlines()
        assert len(before) == 2 + len(described), name  # header, rule, one row each
        assert all(f"`{d.task}`" in row for d, row in zip(described, before[2:])), name
        after = render(name, [*described, new]).splitlines()
        assert after[:-1] == before and "Novel" in after[-1] and "(docs/x.md)" in after[-1], name
