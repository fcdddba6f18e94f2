"""Throughput and memory of preprocess/ stages, as ratios measured in the same run.

    python benchmarks/preprocess_throughput.py [--wiki DUMP.xml.bz2] [--workers N] [--repeat 10]

Prints, for extract / encode / binarize at 1 worker and at --workers:
MB/s of plain text (the extracted, normalised corpus size divided by the stage
time), and the ratio to sentencepiece's own raw encode speed on the same text
(one in-process ``encode`` call over all lines). Then the peak RSS of a full
build of the corpus and of the same corpus repeated --repeat times: streaming
means the two stay about equal. Nothing is asserted; numbers are printed.
"""

import argparse
import bz2
import json
import os
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

# Runs one build in a fresh interpreter and reports the peak RSS of it and of
# its children (pool workers), which the parent cannot see separately.
_RSS_WRAPPER = """
import json, resource, sys
from preprocess.build import main
code = main({argv!r})
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({{"code": code, "self_kb": own, "children_kb": kids}}))
"""


def timed(fn):
    t = time.perf_counter()
    result = fn()
    return time.perf_counter() - t, result


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
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore")
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if r["code"] != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return r["self_kb"] / 1024, r["children_kb"] / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wiki", default=str(DEFAULT_WIKI))
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--repeat", type=int, default=10, help="corpus repetitions for the memory check")
    args = p.parse_args()
    if not Path(args.wiki).exists():
        sys.exit(f"{args.wiki} not found (pass --wiki)")

    tmp = Path(tempfile.mkdtemp(prefix="preprocess-bench-"))
    try:
        worker_counts = sorted({1, args.workers})
        rows = []
        corpus = tmp / "corpus.txt"
        for w in worker_counts:
            secs, totals = timed(
                lambda w=w: extract([("wiki", args.wiki)], corpus, {"lowercase": True, "nfkc": True}, w, False, {})
            )
            rows.append(("extract", w, secs))
        mb = totals["bytes"] / 1e6
        print(f"corpus: {args.wiki}: {totals['documents']} documents, {mb:.2f} MB of normalised text")

        model = tmp / "spm.model"
        model.write_bytes(train_spm(corpus, args.vocab_size, args.workers))
        sp = load_spm(model)
        dict_path = tmp / "dict.txt"
        write_fairseq_dict(sp, dict_path)

        lines = corpus.read_text(encoding="utf-8").split("\n")
        spm_secs, _ = timed(lambda: sp.encode(lines, out_type=str))
        spm_mbps = mb / spm_secs
        for w in worker_counts:
            bpe = tmp / f"corpus.{w}.bpe"
            secs, _ = timed(lambda bpe=bpe, w=w: encode_file(corpus, bpe, model, w))
            rows.append(("encode", w, secs))
        for w in worker_counts:
            secs, _ = timed(lambda w=w: binarize_file(tmp / "corpus.1.bpe", dict_path, tmp / f"bin{w}", w))
            rows.append(("binarize", w, secs))

        print(f"\nsentencepiece raw encode (1 thread, in-process): {spm_mbps:8.2f} MB/s")
        print(f"{'stage':<10}{'workers':>8}{'seconds':>10}{'MB/s':>10}{'x spm raw':>11}{'x 1 worker':>12}")
        single = {stage: secs for stage, w, secs in rows if w == 1}
        for stage, w, secs in rows:
            print(
                f"{stage:<10}{w:>8}{secs:>10.2f}{mb / secs:>10.2f}{(mb / secs) / spm_mbps:>11.2f}"
                f"{single[stage] / secs:>12.2f}"
            )

        # Memory: a full build of the corpus and of the corpus repeated. The
        # spm sample is capped so that vocab training (which holds its sample
        # in memory by design) is the same size in both runs.
        big = tmp / f"repeated{args.repeat}.xml"
        repeated_dump(args.wiki, big, args.repeat)
        common = [
            "--vocab-size",
            args.vocab_size,
            "--workers",
            args.workers,
            "--valid-docs",
            5,
            "--test-docs",
            5,
            "--spm-sample-sentences",
            5000,
        ]
        print(f"\npeak RSS of a full build (--spm-sample-sentences 5000, {args.workers} workers)")
        results = {}
        for label, dump in (("1x", args.wiki), (f"{args.repeat}x", big)):
            out = tmp / f"out-{label}"
            secs, (own, kids) = timed(lambda dump=dump, out=out: peak_rss_mb(["--wiki", dump, "--out", out, *common]))
            results[label] = max(own, kids)
            print(f"  corpus {label:>4}: main process {own:7.1f} MB, largest child {kids:7.1f} MB, {secs:6.1f} s")
        ratio = results[f"{args.repeat}x"] / results["1x"]
        print(f"  peak RSS ratio {args.repeat}x / 1x: {ratio:.2f} (1.0 = flat)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
