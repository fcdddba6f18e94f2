"""One command from raw dumps to the folder ``fairseq-train DATA`` reads.

    python -m preprocess.build --wiki DUMP.xml.bz2 [--wiki ...] [--books DIR] \\
        [--text FILE] --out data-bin --vocab-size 32768 --workers N

Stages (each leaves ``OUT/.work/<stage>.done`` when finished; a rerun skips
finished stages and redoes the first unfinished one and everything after it):

    extract  -> .work/extract/corpus.txt       (normalised documents, one sentence
                                                or paragraph per line: --line-unit)
    split    -> .work/split/{train0..,valid,test}.txt
    vocab    -> .work/vocab/{spm.model,spm.vocab,dict.txt}
    encode   -> .work/bpe/<split>.bpe          (space-separated pieces; lines longer
                                                than --max-line-pieces cut in chunks)
    binarize -> .work/bin/<split>.{bin,idx}    (fairseq mmap)
    finalize -> OUT/... and OUT/preprocess.json, written last: its presence
                marks a complete folder.

Every file is written under a ``.tmp`` name and renamed when complete.
"""
import argparse
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import unicodedata
from pathlib import Path

from tqdm import tqdm

from .errors import PreprocessError
from .text import LINE_UNITS

logger = logging.getLogger("preprocess")

STAGES = ("extract", "split", "vocab", "encode", "binarize", "finalize")
_STAGE_DIRS = {"extract": "extract", "split": "split", "vocab": "vocab", "encode": "bpe", "binarize": "bin"}
RECORD = "preprocess.json"


def _write_json_atomic(path, obj):
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def _tmp(path):
    return Path(str(path) + ".tmp")


def _versions():
    from importlib import metadata

    import fairseq
    import mwparserfromhell
    import sentencepiece

    try:
        blingfire = metadata.version("blingfire")
    except metadata.PackageNotFoundError:
        blingfire = None
    return {
        "python": platform.python_version(),
        "fairseq": fairseq.__version__,
        "sentencepiece": sentencepiece.__version__,
        "mwparserfromhell": mwparserfromhell.__version__,
        "blingfire": blingfire,
        "unicodedata": unicodedata.unidata_version,
    }


def _source_fingerprint(kind, path):
    """Identity of an input for the "same build?" check: path, size, mtime."""
    p = Path(path).resolve()
    if kind == "books" and p.is_dir():
        h = hashlib.sha256()
        for f in sorted(p.rglob("*.txt")):
            st = f.stat()
            h.update(f"{f.relative_to(p)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return {"kind": kind, "path": str(p), "files_digest": h.hexdigest()}
    st = p.stat() if p.exists() else None
    return {"kind": kind, "path": str(p),
            "bytes": st.st_size if st else None, "mtime_ns": st.st_mtime_ns if st else None}


class Build:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.work = self.out / ".work"
        self.sources = ([("wiki", p) for p in args.wiki] + [("books", p) for p in args.books]
                        + [("text", p) for p in args.text])
        self.split_names = (["valid"] if args.valid_docs else []) + (["test"] if args.test_docs else []) \
            + [f"train{k}" for k in range(args.shards)]

    # ---- configuration / resume bookkeeping -------------------------------------------

    def config(self):
        a = self.args
        return {
            "sources": [_source_fingerprint(k, p) for k, p in self.sources],
            "lowercase": a.lowercase, "nfkc": a.nfkc, "vocab_size": a.vocab_size,
            "byte_fallback": a.byte_fallback, "character_coverage": a.character_coverage,
            "spm_sample_sentences": a.spm_sample_sentences, "valid_docs": a.valid_docs,
            "test_docs": a.test_docs, "shards": a.shards, "seed": a.seed, "skip_bad": a.skip_bad,
            # What a line is (extract and everything after it) and the piece cap
            # (encode and after): part of the identity of a build like any other
            # option, so a build with other values is never resumed or reused.
            "line_unit": a.line_unit, "max_line_pieces": a.max_line_pieces,
        }

    def marker(self, stage):
        return self.work / f"{stage}.done"

    def final_prefix(self, name):
        """Where split ``name`` lives in OUT (see the layout in README.md)."""
        if self.args.shards == 1:
            return self.out / ("train" if name.startswith("train") else name)
        shard = int(name[5:]) if name.startswith("train") else 0
        return self.out / f"shard{shard}" / ("train" if name.startswith("train") else name)

    def prepare(self):
        """Returns False when OUT already holds this exact, complete build."""
        config = self.config()
        record = self.out / RECORD
        if self.args.force:
            self.clean()
        if record.exists():
            done = json.loads(record.read_text(encoding="utf-8"))
            if done.get("config") == config:
                logger.info("%s is complete for these inputs and options; nothing to do", self.out)
                return False
            raise PreprocessError(
                record, "OUT already holds a build with other inputs or options; "
                        "use another --out or pass --force to rebuild it")
        self.work.mkdir(parents=True, exist_ok=True)
        cfg_path = self.work / "config.json"
        if cfg_path.exists():
            if json.loads(cfg_path.read_text(encoding="utf-8")) != config:
                raise PreprocessError(
                    cfg_path, "an unfinished build with other inputs or options is in OUT; "
                              "use another --out or pass --force to start over")
        else:
            _write_json_atomic(cfg_path, config)
        return True

    def clean(self):
        """--force: remove what this tool writes in OUT (and nothing else)."""
        shutil.rmtree(self.work, ignore_errors=True)
        for name in (RECORD, "dict.txt", "spm.model", "spm.vocab"):
            (self.out / name).unlink(missing_ok=True)
        for split in ("train", "valid", "test"):
            for ext in (".bin", ".idx"):
                (self.out / (split + ext)).unlink(missing_ok=True)
        if self.out.exists():
            for d in self.out.glob("shard[0-9]*"):
                if d.is_dir():
                    shutil.rmtree(d)

    def run(self):
        results = {}
        for i, stage in enumerate(STAGES):
            marker = self.marker(stage)
            if marker.exists():
                logger.info("stage %s: already done, skipping", stage)
                results[stage] = json.loads(marker.read_text(encoding="utf-8"))
            else:
                # Later stages were built from an older version of this one.
                for later in STAGES[i + 1:]:
                    self.marker(later).unlink(missing_ok=True)
                    if later in _STAGE_DIRS:
                        shutil.rmtree(self.work / _STAGE_DIRS[later], ignore_errors=True)
                logger.info("stage %s: running", stage)
                results[stage] = getattr(self, "stage_" + stage)(results)
                if stage != "finalize":
                    _write_json_atomic(marker, results[stage])
                logger.info("stage %s: done", stage)
            if self.args.stop_after == stage:
                logger.info("stopping after stage %s (--stop-after)", stage)
                return results
        return results

    # ---- stages ----------------------------------------------------------------------

    def stage_extract(self, results):
        from . import text as textmod
        from .extract import extract

        if self.args.line_unit == "sentence":
            textmod.sentence_splitter_available()  # a clear error here, not in a pool worker
        d = self.work / "extract"
        d.mkdir(parents=True, exist_ok=True)
        corpus = d / "corpus.txt"
        stats = {}
        totals = extract(self.sources, _tmp(corpus),
                         {"lowercase": self.args.lowercase, "nfkc": self.args.nfkc,
                          "line_unit": self.args.line_unit},
                         self.args.workers, self.args.skip_bad, stats)
        if totals["documents"] == 0:
            raise PreprocessError(", ".join(str(p) for _, p in self.sources),
                                  "no text found in the input (no documents after cleaning)")
        logger.info("extract: %d documents, %d paragraphs -> %d lines (--line-unit %s)",
                    totals["documents"], totals["paragraphs"], totals["lines"], self.args.line_unit)
        os.replace(_tmp(corpus), corpus)
        return {"corpus": str(corpus.relative_to(self.out)), "totals": totals, "sources": stats}

    def stage_split(self, results):
        from .split import split

        a = self.args
        n = results["extract"]["totals"]["documents"]
        if n - a.valid_docs - a.test_docs < a.shards:
            raise PreprocessError(
                ", ".join(str(p) for _, p in self.sources),
                f"only {n} documents: --valid-docs {a.valid_docs} + --test-docs {a.test_docs} "
                f"leave fewer than one train document per shard (--shards {a.shards})")
        d = self.work / "split"
        d.mkdir(parents=True, exist_ok=True)
        final = {name: d / f"{name}.txt" for name in self.split_names}
        counts = split(self.work / "extract" / "corpus.txt", n, a.valid_docs, a.test_docs,
                       a.shards, a.seed, {k: _tmp(v) for k, v in final.items()})
        for k, v in final.items():
            os.replace(_tmp(v), v)
        return counts

    def stage_vocab(self, results):
        from . import vocab

        d = self.work / "vocab"
        d.mkdir(parents=True, exist_ok=True)
        train_files = [self.work / "split" / f"train{k}.txt" for k in range(self.args.shards)]
        train_lines = sum(results["split"][f"train{k}"]["lines"] for k in range(self.args.shards))
        sample = d / "spm_sample.txt"
        kept = vocab.systematic_sample(train_files, train_lines, self.args.spm_sample_sentences, _tmp(sample))
        os.replace(_tmp(sample), sample)
        logger.info("training sentencepiece BPE (%d pieces) on %d lines", self.args.vocab_size, kept)
        model = vocab.train_spm(sample, self.args.vocab_size, self.args.workers,
                                byte_fallback=self.args.byte_fallback,
                                character_coverage=self.args.character_coverage)
        model_path = d / "spm.model"
        _tmp(model_path).write_bytes(model)
        sp = vocab.load_spm(_tmp(model_path))
        vocab.write_spm_vocab(sp, _tmp(d / "spm.vocab"))
        vocab.write_fairseq_dict(sp, _tmp(d / "dict.txt"))
        # The model goes last: its presence is what encode relies on.
        os.replace(_tmp(d / "spm.vocab"), d / "spm.vocab")
        os.replace(_tmp(d / "dict.txt"), d / "dict.txt")
        os.replace(_tmp(model_path), model_path)
        return {"sample_lines": kept, "pieces": sp.get_piece_size()}

    def stage_encode(self, results):
        from .encode import encode_file

        d = self.work / "bpe"
        d.mkdir(parents=True, exist_ok=True)
        model = self.work / "vocab" / "spm.model"
        total = sum(results["split"][name]["lines"] + results["split"][name]["documents"] - 1
                    for name in self.split_names)
        max_pieces = self.args.max_line_pieces
        counts = {}
        with tqdm(total=total, desc="encode", unit=" lines", disable=None) as bar:
            for name in self.split_names:
                dst = d / f"{name}.bpe"
                src = self.work / "split" / f"{name}.txt"
                stats = d / f"{name}.counts.json"
                if dst.exists() and stats.exists():  # finished before an interruption
                    logger.info("encode %s: reusing %s", name, dst)
                    counts[name] = json.loads(stats.read_text(encoding="utf-8"))
                    bar.update(counts[name]["input_lines"])
                    continue
                counts[name] = encode_file(src, _tmp(dst), model, self.args.workers, progress=bar,
                                           max_pieces=max_pieces)
                # The counts first: a .bpe in place always has its counts beside it.
                _write_json_atomic(stats, counts[name])
                os.replace(_tmp(dst), dst)
        cut = sum(c["lines_cut"] for c in counts.values())
        added = sum(c["chunks_added"] for c in counts.values())
        lines = sum(c["input_lines"] for c in counts.values())
        if max_pieces:
            logger.info("encode: %d of %d lines were longer than --max-line-pieces %d pieces and were "
                        "cut into chunks (%d extra lines)", cut, lines, max_pieces, added)
        return counts

    def stage_binarize(self, results):
        from .binarize import binarize_file

        d = self.work / "bin"
        d.mkdir(parents=True, exist_ok=True)
        dict_path = self.work / "vocab" / "dict.txt"
        counts = {}
        for name in tqdm(self.split_names, desc="binarize", unit=" splits", disable=None):
            tmp_prefix = d / f"{name}.tmp"
            seqs, toks = binarize_file(self.work / "bpe" / f"{name}.bpe", dict_path, tmp_prefix, self.args.workers)
            # .idx last: fairseq opens a dataset through its index.
            os.replace(d / f"{name}.tmp.bin", d / f"{name}.bin")
            os.replace(d / f"{name}.tmp.idx", d / f"{name}.idx")
            counts[name] = {"sequences": seqs, "tokens": toks}
        return counts

    def stage_finalize(self, results):
        a = self.args

        def place(src, dst):
            # Moves are idempotent so an interrupted finalize can simply run again.
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.exists():
                os.replace(src, dst)
            elif not dst.exists():
                raise FileNotFoundError(src)

        def copy(src, dst):
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, _tmp(dst))
            os.replace(_tmp(dst), dst)

        vocab_dir = self.work / "vocab"
        for name in ("spm.model", "spm.vocab", "dict.txt"):
            copy(vocab_dir / name, self.out / name)
        if a.shards > 1:
            # Each shard is a complete fairseq data dir of its own (dict + spm beside it).
            for k in range(a.shards):
                for name in ("dict.txt", "spm.model"):
                    copy(vocab_dir / name, self.out / f"shard{k}" / name)
        for name in self.split_names:
            prefix = self.final_prefix(name)
            for ext in (".bin", ".idx"):
                place(self.work / "bin" / f"{name}{ext}", Path(str(prefix) + ext))
        splits = {}
        for name in self.split_names:
            enc = results["encode"][name]
            splits[name] = dict(results["split"][name], **results["binarize"][name],
                                lines_cut=enc["lines_cut"], chunks_added=enc["chunks_added"],
                                path=str(self.final_prefix(name).relative_to(self.out)))
        from . import text as textmod
        from . import vocab as vocabmod

        pieces = results["vocab"]["pieces"]
        record = {
            "format": "seed_fairseq.preprocess/1",
            "normalization": {
                "function": "preprocess.text.normalize_line",
                "lowercase": a.lowercase,
                "nfkc": a.nfkc,
                "whitespace": "runs of Unicode whitespace -> one space; strip; control characters dropped",
                "steps": list(textmod.NORMALIZATION_STEPS),
                "unicodedata_version": unicodedata.unidata_version,
                "line_unit": a.line_unit,
            },
            "lines": {
                "unit": a.line_unit,
                "sentence_splitter": (textmod.SENTENCE_SPLITTER + " (cased text, cut only at spaces)"
                                      if a.line_unit == "sentence" else None),
                "paragraphs": results["extract"]["totals"]["paragraphs"],
                "lines": results["extract"]["totals"]["lines"],
                "paragraphs_kept_whole": results["extract"]["totals"]["paragraphs_kept_whole"],
                "max_line_pieces": a.max_line_pieces,
                "lines_cut": sum(s["lines_cut"] for s in splits.values()),
                "chunks_added": sum(s["chunks_added"] for s in splits.values()),
                "rule": "sentences of a paragraph joined by one space = the normalised paragraph; "
                        "a line of more than max_line_pieces pieces is cut into consecutive chunks "
                        "of at most max_line_pieces pieces, one per line, pieces unchanged (0 = no cut)",
            },
            "sentencepiece": {
                "model": "spm.model", "model_type": "bpe", "vocab_size": pieces,
                "normalization_rule_name": "identity", "byte_fallback": a.byte_fallback,
                "character_coverage": a.character_coverage,
                "special_ids": {"unk": 0, "bos": 1, "eos": 2, "pad": -1},
                "sample_sentences_requested": a.spm_sample_sentences,
                "sample_lines_used": results["vocab"]["sample_lines"],
            },
            "fairseq_dictionary": {
                "file": "dict.txt", "convention": "xlm-r (fairseq_offset=1)",
                "rule": "fairseq = spm + 1 for spm >= 3; spm <unk> 0 -> 3, <s> 1 -> 0, </s> 2 -> 2; "
                        "<pad> = 1; <mask> appended by the task = len(spm) + 1",
                "function": "preprocess.vocab.spm_to_fairseq_id",
                "counts": "1 for every piece",
                "size_with_specials": pieces + 1,
                "mask_index": vocabmod.spm_to_fairseq_id(pieces - 1) + 1,
            },
            "sources": [dict(kind=k, path=str(Path(p).resolve()),
                             stats=results["extract"]["sources"].get(str(p), {}))
                        for k, p in self.sources],
            "documents": results["extract"]["totals"],
            "splits": splits,
            "shards": a.shards,
            "seed": a.seed,
            "versions": _versions(),
            "config": self.config(),
        }
        _write_json_atomic(self.out / RECORD, record)
        if not a.keep_work:
            shutil.rmtree(self.work, ignore_errors=True)
        return record


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m preprocess.build",
        description="Raw Wikipedia dumps / BookCorpus-style text -> sentencepiece BPE + fairseq mmap data.",
    )
    g = p.add_argument_group("inputs (read in this order: all --wiki, all --books, all --text)")
    g.add_argument("--wiki", action="append", default=[], metavar="DUMP",
                   help="MediaWiki XML export, .xml or .xml.bz2 (repeatable)")
    g.add_argument("--books", action="append", default=[], metavar="DIR",
                   help="directory of .txt files, one book per file (repeatable)")
    g.add_argument("--text", action="append", default=[], metavar="FILE",
                   help="text with one paragraph (or sentence) per line, blank line between documents "
                        "(repeatable)")
    p.add_argument("--out", required=True, help="output folder (fairseq data dir)")
    p.add_argument("--vocab-size", type=int, default=32768, help="sentencepiece pieces (default 32768)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    p.add_argument("--line-unit", choices=LINE_UNITS, default="sentence",
                   help="what one line (one fairseq item) is: 'sentence' (default; paragraphs split "
                        "by blingfire, as in BERT/RoBERTa/SEED data) or 'paragraph'")
    p.add_argument("--max-line-pieces", type=int, default=510, metavar="N",
                   help="cut any line longer than N sentencepiece pieces into consecutive chunks of at "
                        "most N (nothing is lost), so --sample-break-mode complete never makes an "
                        "oversized block; default 510 = --tokens-per-sample 512 minus [CLS] and </s>; "
                        "0 = never cut")
    p.add_argument("--spm-sample-sentences", type=int, default=1_000_000,
                   help="train lines (sentences or paragraphs, see --line-unit) sampled for "
                        "sentencepiece; 0 = all (default 1000000)")
    p.add_argument("--character-coverage", type=float, default=0.9995)
    p.add_argument("--byte-fallback", action=argparse.BooleanOptionalAction, default=True,
                   help="unknown characters become UTF-8 byte pieces (default on); off: they become <unk>")
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                   help="lower-case all text (default on: the released SEED-Encoder is uncased)")
    p.add_argument("--nfkc", action=argparse.BooleanOptionalAction, default=True,
                   help="Unicode NFKC normalisation (default on)")
    p.add_argument("--valid-docs", type=int, default=1000, help="documents held out for valid (default 1000)")
    p.add_argument("--test-docs", type=int, default=1000, help="documents held out for test (default 1000)")
    p.add_argument("--shards", type=int, default=1, help="train shards: OUT/shard0..N-1 when N > 1")
    p.add_argument("--seed", type=int, default=1, help="seed of the valid/test document choice")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip (and count) non-UTF-8 lines of text inputs instead of stopping")
    p.add_argument("--keep-work", action="store_true", help="keep OUT/.work (normalised text, pieces)")
    p.add_argument("--force", action="store_true", help="discard an earlier build in OUT and start over")
    p.add_argument("--stop-after", choices=STAGES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not (args.wiki or args.books or args.text):
        p.error("give at least one input: --wiki, --books or --text")
    for name in ("vocab_size", "workers", "shards"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("valid_docs", "test_docs", "spm_sample_sentences", "max_line_pieces"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(name)s | %(message)s", stream=sys.stderr)
    try:
        build = Build(args)
        if build.prepare():
            build.run()
    except PreprocessError as e:
        print(f"error: {e.path}: {e.problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
