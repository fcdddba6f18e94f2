"""Throughput of preprocess/ per stage at 1 and N workers, against raw sentencepiece and WikiExtractor.

    python benchmarks/preprocess_throughput.py [--wiki DUMP.xml.bz2] [--workers 2] [--text-mb 24]
        [--repeat 4] [--wikiextractor-python PY] [--json OUT]

Measured in one run, on this machine:

* **extract** (``preprocess.extract``: XML + wikitext cleaning + normalisation + sentence
  split) on the dump, at 1 and ``--workers`` workers; MB/s of uncompressed dump XML. Row
  ``extract`` is the default cleaner (``--wiki-cleaner scanner``), ``extract-parser`` the
  mwparserfromhell one (``--wiki-cleaner parser``).
* **WikiExtractor** (PyPI ``wikiextractor``, the extractor most pipelines use) on the same
  dump with ``--processes`` 1 and ``--workers`` (its default options: templates dropped,
  no template expansion without the Template namespace); the same MB/s. It is run by the
  interpreter ``--wikiextractor-python`` (default: this one if it can import wikiextractor,
  else the row is skipped with a note; install it with ``pip install .[bench]``).
  **Markup leftovers**: occurrences of ``LEFTOVERS`` (wiki/HTML markup that is not prose)
  in each tool's text, case-insensitive.
* **encode** (sentencepiece pieces, order kept) and **binarize** (fairseq mmap) on the
  extracted text repeated to about ``--text-mb`` MB, at 1 and ``--workers`` workers; MB/s
  of text, and the ratio to **raw sentencepiece** (one in-process, one-thread
  ``encode(lines, out_type=str)`` over the same text). ``pipeline per core`` = encode then
  binarize with 1 worker, as a fraction of raw sentencepiece.
* **peak RSS** of a full build of the dump and of the dump repeated ``--repeat`` times:
  streaming keeps the two about equal.

Times are wall clock; "CPU s" is the process's CPU time plus its workers'. On a machine
that other jobs share, wall-clock scaling with workers is bounded by the free cores: the
load average is printed. Nothing is asserted.
"""

import argparse
import bz2
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preprocess.binarize import binarize_file
from preprocess.encode import encode_file
from preprocess.extract import extract
from preprocess.vocab import load_spm, train_spm, write_fairseq_dict

REPO = Path(__file__).resolve().parents[1]

DEFAULT_WIKI = REPO.parent / "shared" / "data" / "enwiki-sample-206-pages.xml.bz2"
# wiki / HTML markup that is never prose (case-insensitive substrings)
LEFTOVERS = (
    "{{",
    "}}",
    "[[",
    "]]",
    "{|",
    "|}",
    "|-",
    "<ref",
    "</ref",
    "<!--",
    "-->",
    "''",
    "__",
    "&nbsp;",
    "&amp;",
    "&lt;",
    "&gt;",
    "&quot;",
    "thumb|",
    "px|",
    "file:",
    "image:",
    "category:",
)

_RSS_WRAPPER = """
import json, resource, sys
from preprocess.build import main
code = main({argv!r})
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({{"code": code, "self_kb": own, "children_kb": kids}}))
"""


def cpu_seconds():
    """CPU time of this process and of its finished children (pool workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn):
    t, c = time.perf_counter(), cpu_seconds()
    result = fn()
    return time.perf_counter() - t, cpu_seconds() - c, result


def dump_xml_mb(path):
    opener = bz2.open if open(path, "rb").read(3) == b"BZh" else open
    n = 0
    with opener(path, "rb") as f:
        while True:
            block = f.read(1 << 22)
            if not block:
                return n / 1e6
            n += len(block)


def parser_ceiling(dump):
    """Wall seconds of reading the dump's pages and running mwparserfromhell's C tokenizer on
    each, nothing else: what any extractor built on that parser needs at least (1 process)."""
    from mwparserfromhell.parser import Parser

    from preprocess.wiki import iter_pages

    tokenize = Parser()._tokenizer.tokenize
    t = time.perf_counter()
    for page in iter_pages(dump, {}):
        tokenize(page, 0, False)
    return time.perf_counter() - t


def leftovers(text):
    low = text.lower()
    counts = {tok: low.count(tok) for tok in LEFTOVERS}
    return {"total": sum(counts.values()), "by_token": {k: v for k, v in counts.items() if v}}


def wikiextractor_python(requested):
    candidates = [requested] if requested else [sys.executable, os.environ.get("WIKIEXTRACTOR_PYTHON")]
    for py in filter(None, candidates):
        ok = subprocess.run([py, "-c", "import wikiextractor.WikiExtractor"], capture_output=True).returncode == 0
        if ok:
            return py
    return None


def run_wikiextractor(py, dump, out_dir, processes):
    """(wall s, CPU s, the articles' text): WikiExtractor with its default options."""
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [py, "-m", "wikiextractor.WikiExtractor", str(dump), "-o", str(out_dir), "--processes", str(processes)]
    cmd.append("-q")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"WikiExtractor failed: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    parts = []
    for f in sorted(Path(out_dir).rglob("wiki_*")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if not re.match(r"</?doc( |>)", line):
                parts.append(line)
    return wall, cpu, "\n".join(parts) + "\n", " ".join(cmd)


def raw_spm_encode(sp, path):
    """sentencepiece alone: every line of ``path`` to pieces, one call, one thread (the text read first)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    t = time.perf_counter()
    sp.encode(lines, out_type=str, num_threads=1)
    return time.perf_counter() - t


def repeated_dump(src, dst, times):
    """The dump's pages ``times`` over in one (uncompressed) export, written streaming."""
    opener = bz2.open if open(src, "rb").read(3) == b"BZh" else open
    with opener(src, "rb") as f:
        data = f.read()
    head_end = data.index(b"<page>")
    tail_start = data.rindex(b"</mediawiki>")
    with open(dst, "wb") as out:
        out.write(data[:head_end])
        for _ in range(times):
            out.write(data[head_end:tail_start])
        out.write(data[tail_start:])


def peak_rss_mb(argv):
    code = _RSS_WRAPPER.format(argv=[str(a) for a in argv])
    env = dict(os.environ, PYTHONWARNINGS="ignore")  # the package is installed: no PYTHONPATH
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if r["code"] != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return r["self_kb"] / 1024, r["children_kb"] / 1024


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wiki", default=str(DEFAULT_WIKI))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--text-mb", type=float, default=24, help="size of the text encode/binarize run on (MB)")
    p.add_argument("--repeat", type=int, default=4, help="dump repetitions for the memory check (0: skip)")
    p.add_argument("--wikiextractor-python", help="interpreter that has wikiextractor installed")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if not Path(args.wiki).exists():
        sys.exit(f"{args.wiki} not found (pass --wiki)")
    counts = sorted({1, args.workers})
    res = {"load_average": os.getloadavg(), "workers": args.workers}
    tmp = Path(tempfile.mkdtemp(prefix="preprocess-bench-"))
    try:
        xml_mb = dump_xml_mb(args.wiki)
        res["dump_xml_mb"] = xml_mb
        # ---- extraction: ours and WikiExtractor's, same dump, same worker counts
        rows = []
        corpus = tmp / "corpus.txt"
        for stage, cleaner, out in (
            ("extract-parser", "parser", tmp / "corpus-parser.txt"),
            ("extract", "scanner", corpus),
        ):
            options = {"lowercase": True, "nfkc": True, "wiki_cleaner": cleaner}
            for w in counts:
                wall, cpu, totals = timed(
                    lambda w=w, o=out, opt=options: extract([("wiki", args.wiki)], o, opt, w, False, {})
                )
                rows.append({"stage": stage, "workers": w, "wall_s": wall, "cpu_s": cpu, "mb": xml_mb})
        res["parser_ceiling_mbps"] = xml_mb / parser_ceiling(args.wiki)
        ours_text = corpus.read_text(encoding="utf-8")
        res["extract_leftovers"] = leftovers(ours_text)
        res["extract_parser_leftovers"] = leftovers((tmp / "corpus-parser.txt").read_text(encoding="utf-8"))
        res["extract_documents"] = totals["documents"]
        py = wikiextractor_python(args.wikiextractor_python)
        if py:
            for w in counts:
                wall, cpu, text, cmd = run_wikiextractor(py, args.wiki, tmp / "wikiextractor", w)
                rows.append({"stage": "wikiextractor", "workers": w, "wall_s": wall, "cpu_s": cpu, "mb": xml_mb})
            res["wikiextractor_leftovers"] = leftovers(text)
            res["wikiextractor_command"] = cmd
        else:
            res["wikiextractor_skipped"] = (
                "wikiextractor is not importable (pip install .[bench], or pass --wikiextractor-python)"
            )

        # ---- encode / binarize on the extracted text, repeated to --text-mb
        reps = max(1, round(args.text_mb * 1e6 / max(1, len(ours_text.encode("utf-8")))))
        big = tmp / "text.txt"
        with open(big, "w", encoding="utf-8", newline="\n") as f:
            for _ in range(reps):
                f.write(ours_text if ours_text.endswith("\n") else ours_text + "\n")
        text_mb = big.stat().st_size / 1e6
        res["text_mb"] = text_mb
        model = tmp / "spm.model"
        model.write_bytes(train_spm(corpus, args.vocab_size, args.workers))
        sp = load_spm(model)
        write_fairseq_dict(sp, tmp / "dict.txt")
        res["spm_raw_mbps"] = text_mb / raw_spm_encode(sp, big)
        for w in counts:
            wall, cpu, _ = timed(lambda w=w: encode_file(big, tmp / f"text.{w}.bpe", model, w, max_pieces=510))
            rows.append({"stage": "encode", "workers": w, "wall_s": wall, "cpu_s": cpu, "mb": text_mb})
        for w in counts:
            wall, cpu, _ = timed(lambda w=w: binarize_file(tmp / "text.1.bpe", tmp / "dict.txt", tmp / f"bin{w}", w))
            rows.append({"stage": "binarize", "workers": w, "wall_s": wall, "cpu_s": cpu, "mb": text_mb})
        same = [(tmp / f"bin{w}.bin").read_bytes() == (tmp / "bin1.bin").read_bytes() for w in counts]
        res["binarize_identical_across_workers"] = all(same)
        for r in rows:
            r["mbps"] = r["mb"] / r["wall_s"]
        single = {r["stage"]: r["wall_s"] for r in rows if r["workers"] == 1}
        for r in rows:
            r["speedup"] = single[r["stage"]] / r["wall_s"]
        res["rows"] = rows
        enc1 = next(r for r in rows if r["stage"] == "encode" and r["workers"] == 1)
        bin1 = next(r for r in rows if r["stage"] == "binarize" and r["workers"] == 1)
        res["pipeline_per_core_mbps"] = text_mb / (enc1["wall_s"] + bin1["wall_s"])
        res["pipeline_vs_spm"] = res["pipeline_per_core_mbps"] / res["spm_raw_mbps"]

        print(
            f"\ndump {Path(args.wiki).name}: {xml_mb:.1f} MB of XML, {res['extract_documents']} articles; "
            f"encode/binarize on {text_mb:.1f} MB of text; load average {res['load_average'][0]:.1f} "
            f"on {os.cpu_count()} cores"
        )
        print(f"raw sentencepiece encode (1 thread, in-process): {res['spm_raw_mbps']:.2f} MB/s")
        print(f"{'stage':<15}{'workers':>8}{'seconds':>9}{'CPU s':>8}{'MB/s':>8}{'x 1 worker':>11}{'x spm raw':>10}")
        for r in rows:
            vs_spm = f"{r['mbps'] / res['spm_raw_mbps']:>10.2f}" if r["stage"] in ("encode", "binarize") else ""
            print(
                f"{r['stage']:<15}{r['workers']:>8}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}{r['mbps']:>8.2f}"
                f"{r['speedup']:>11.2f}{vs_spm}"
            )
        print(
            f"pipeline per core (encode + binarize, 1 worker): {res['pipeline_per_core_mbps']:.2f} MB/s = "
            f"{res['pipeline_vs_spm']:.2f} x raw sentencepiece"
        )
        print(f"markup leftovers, ours (--wiki-cleaner scanner, the default): {res['extract_leftovers']}")
        print(f"markup leftovers, ours (--wiki-cleaner parser): {res['extract_parser_leftovers']}")
        if py:
            print(f"markup leftovers, WikiExtractor: {res['wikiextractor_leftovers']}")
            for w in counts:
                theirs = next(r for r in rows if r["stage"] == "wikiextractor" and r["workers"] == w)
                for stage, key, label in (
                    ("extract", "extract_vs_wikiextractor", "scanner"),
                    ("extract-parser", "extract_parser_vs_wikiextractor", "parser"),
                ):
                    ours = next(r for r in rows if r["stage"] == stage and r["workers"] == w)
                    res[f"{key}_{w}"] = ratio = ours["mbps"] / theirs["mbps"]
                    print(f"extraction throughput ours ({label}) / WikiExtractor at {w} worker(s): {ratio:.2f}")
            theirs = next(r for r in rows if r["stage"] == "wikiextractor" and r["workers"] == 1)
            res["parser_ceiling_vs_wikiextractor"] = res["parser_ceiling_mbps"] / theirs["mbps"]
            print(
                f"XML + mwparserfromhell's tokenizer alone (the ceiling of the parser cleaner, 1 process): "
                f"{res['parser_ceiling_mbps']:.2f} MB/s = {res['parser_ceiling_vs_wikiextractor']:.2f} x WikiExtractor"
            )
        else:
            print(f"WikiExtractor: skipped ({res['wikiextractor_skipped']})")

        # ---- memory: a full build of the dump and of the dump repeated
        if args.repeat > 1:
            repeated = tmp / f"repeated{args.repeat}.xml"
            repeated_dump(args.wiki, repeated, args.repeat)
            common = ["--vocab-size", args.vocab_size, "--workers", args.workers, "--valid-docs", 5]
            common += ["--test-docs", 5, "--spm-sample-sentences", 5000]
            peaks = {}
            for label, dump in (("1x", args.wiki), (f"{args.repeat}x", repeated)):
                wall, _, (own, kids) = timed(
                    lambda dump=dump, label=label: peak_rss_mb(["--wiki", dump, "--out", tmp / f"out-{label}", *common])
                )
                peaks[label] = max(own, kids)
                print(f"full build, dump {label:>3}: main {own:6.0f} MB, largest worker {kids:6.0f} MB, {wall:5.1f} s")
            res["peak_rss_mb"] = peaks
            res["peak_rss_ratio"] = peaks[f"{args.repeat}x"] / peaks["1x"]
            print(f"peak RSS {args.repeat}x / 1x: {res['peak_rss_ratio']:.2f} (1.0 = flat)")
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
