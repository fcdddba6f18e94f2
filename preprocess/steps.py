"""The stage bodies of ``preprocess.build``: what each of its stages writes under
``OUT/.work`` (extract, split, vocab or the tokenizer's vocab, encode, binarize) and how
finalize moves the result into ``OUT`` with the record, last.

:class:`StageBodies` is a base of :class:`preprocess.build.Build`, which holds the state
they read (``opts``, ``out``, ``work``, ``sources``, the input hasher, the tokenizer's
identity) and lists them as stages (``Build.stages``).
"""

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from tqdm import tqdm

from seed_fairseq.base.fileio import atomic_path, copy_atomic, write_json_atomic

from . import record as rec
from .errors import PreprocessError, writing
from .inputs import InputHasher
from .options import BuildOptions
from .ownership import check_collisions
from .record import RECORD
from .stages import Runner

logger = logging.getLogger("preprocess")


def save_tokenizer(tok, folder: Path) -> None:
    """``tok.save_pretrained(folder)``, with an OS error of the Rust tokenizers (a plain
    ``Exception("... (os error 28)")``) raised as the OSError it is."""
    try:
        tok.save_pretrained(str(folder))
    except Exception as e:
        m = re.search(r"\(os error (\d+)\)", str(e))
        if type(e) is not Exception or m is None:
            raise
        code = int(m.group(1))
        raise OSError(code, os.strerror(code)) from e


class StageBodies:
    """The ``stage_*`` methods of :class:`preprocess.build.Build` (one per stage), and
    the state of the build they read (set by ``Build``)."""

    opts: BuildOptions
    out: Path
    work: Path
    sources: List[Tuple[str, str]]
    hasher: InputHasher
    identities: List[Dict[str, Any]]
    runner: Runner
    tokenizer_dir: Optional[Path]
    tokenizer_sha256: Optional[str]

    def config(self) -> Dict[str, Any]:
        raise NotImplementedError  # Build.config: the record's identity of the build

    def stage_extract(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from . import text as textmod
        from .extract import extract

        if self.opts.line_unit == "sentence":
            textmod.sentence_splitter_available()  # a clear error here, not in a pool worker
        corpus = self.work / "extract" / "corpus.txt"
        stats = {}
        with writing(corpus), atomic_path(corpus) as tmp:
            totals = extract(
                self.sources,
                tmp,
                {
                    "lowercase": self.opts.lowercase,
                    "nfkc": self.opts.nfkc,
                    "line_unit": self.opts.line_unit,
                    "wiki_cleaner": self.opts.wiki_cleaner,
                    "wiki_page_seconds": self.opts.wiki_page_seconds,
                },
                self.opts.workers,
                self.opts.skip_bad,
                stats,
            )
            if totals["documents"] == 0:
                raise PreprocessError(
                    ", ".join(str(p) for _, p in self.sources),
                    "no text found in the input (no documents after cleaning)",
                )
            changed = self.hasher.changed_since_hashed()
            if changed:
                # The fingerprint names the content hashed before reading.
                raise PreprocessError(changed, "changed while it was being read; run the command again")
        logger.info(
            "extract: %d documents, %d paragraphs -> %d lines (--line-unit %s)",
            totals["documents"],
            totals["paragraphs"],
            totals["lines"],
            self.opts.line_unit,
        )
        # Stats by position (not by path): a reused extraction stays right when
        # an input was only renamed.
        return {
            "corpus": str(corpus.relative_to(self.out)),
            "totals": totals,
            "sources": [stats.get(str(p), {"kind": k}) for k, p in self.sources],
        }

    def stage_split(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from .split import AUTO_FRACTION_PERCENT, AUTO_MAX, choose_held_out, split

        a = self.opts
        n = results["extract"]["totals"]["documents"]
        valid, test = choose_held_out(n, a.valid_docs, a.test_docs, a.shards)
        if n - valid - test < a.shards:
            raise PreprocessError(
                ", ".join(str(p) for _, p in self.sources),
                f"only {n} documents: --valid-docs {valid} + --test-docs {test} "
                f"leave fewer than one train document per shard (--shards {a.shards})",
            )
        chosen = [
            name for name, given in (("--valid-docs", a.valid_docs), ("--test-docs", a.test_docs)) if given is None
        ]
        if chosen:
            logger.info(
                "held out %d valid and %d test documents of %d (%s not given: %d%% of the "
                "documents each, at most %d, and at least one train document per shard)",
                valid,
                test,
                n,
                " and ".join(chosen),
                AUTO_FRACTION_PERCENT,
                AUTO_MAX,
            )
        names = (["valid"] if valid else []) + (["test"] if test else []) + [f"train{k}" for k in range(a.shards)]
        d = self.work / "split"
        with writing(d), contextlib.ExitStack() as stack:  # several files at once: the folder
            tmps = {name: stack.enter_context(atomic_path(d / f"{name}.txt")) for name in names}
            counts = split(self.work / "extract" / "corpus.txt", n, valid, test, a.shards, a.seed, tmps)
        return {
            "valid_docs": valid,
            "test_docs": test,
            "chosen": {
                "valid_docs": "auto" if a.valid_docs is None else "given",
                "test_docs": "auto" if a.test_docs is None else "given",
            },
            "splits": counts,
        }

    @staticmethod
    def split_names(results: Dict[str, Any]) -> List[str]:
        return list(results["split"]["splits"])

    def stage_vocab(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from . import vocab

        d = self.work / "vocab"
        splits = results["split"]["splits"]
        train_files = [self.work / "split" / f"train{k}.txt" for k in range(self.opts.shards)]
        train_lines = sum(splits[f"train{k}"]["lines"] for k in range(self.opts.shards))
        sample = d / "spm_sample.txt"
        with writing(sample), atomic_path(sample) as tmp:
            kept = vocab.systematic_sample(train_files, train_lines, self.opts.spm_sample_sentences, tmp)
        logger.info(
            "training sentencepiece BPE (%d pieces) on %d train lines (of %d; --spm-sample-sentences)",
            self.opts.vocab_size,
            kept,
            train_lines,
        )
        model = vocab.train_spm(
            sample,
            self.opts.vocab_size,
            self.opts.workers,
            byte_fallback=self.opts.byte_fallback,
            character_coverage=self.opts.character_coverage,
        )
        # The model is renamed into place last (after spm.vocab and dict.txt).
        with writing(d / "spm.model"), atomic_path(d / "spm.model") as tmp_model:
            tmp_model.write_bytes(model)
            sp = vocab.load_spm(tmp_model)
            with writing(d / "spm.vocab"), atomic_path(d / "spm.vocab") as tmp:
                vocab.write_spm_vocab(sp, tmp)
            with writing(d / "dict.txt"), atomic_path(d / "dict.txt") as tmp:
                vocab.write_fairseq_dict(sp, tmp)
        return {"sample_lines": kept, "pieces": sp.get_piece_size()}

    def stage_tokenizer_vocab(self, results: Dict[str, Any]) -> Dict[str, Any]:
        """dict.txt, the id mapping and a copy of the tokenizer (seed_fairseq.base.vocabulary.tokenizer)."""
        from seed_fairseq.base.vocabulary.tokenizer import RECORD as VOCAB_RECORD
        from seed_fairseq.base.vocabulary.tokenizer import load_fast_tokenizer, vocab_from_tokenizer, write_dict

        d = self.work / "vocab"
        tok = load_fast_tokenizer(self.tokenizer_dir)
        vocab = vocab_from_tokenizer(tok, self.tokenizer_dir)
        if vocab.sha256 != self.tokenizer_sha256:
            raise PreprocessError(self.tokenizer_dir, "changed while the build ran; run the command again")
        staging = d / "tokenizer.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        with writing(d / "tokenizer"):
            save_tokenizer(tok, staging)
        files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        shutil.rmtree(d / "tokenizer", ignore_errors=True)
        os.replace(staging, d / "tokenizer")
        with writing(d / VOCAB_RECORD):
            write_json_atomic(d / VOCAB_RECORD, vocab.record())
        # dict.txt last: the folder's other files are in place when it appears
        with writing(d / "dict.txt"):
            write_dict(vocab, d / "dict.txt")
        logger.info(
            "vocab: the tokenizer of %s, %d tokens (%s)",
            self.tokenizer_dir,
            len(vocab.symbols),
            "ids unchanged" if vocab.is_identity else "specials moved to fairseq's positions",
        )
        return {
            "pieces": len(vocab.symbols),
            "record": vocab.record(),
            "tokenizer_files": ["tokenizer/" + f for f in files],
            "source": str(Path(self.tokenizer_dir).resolve()),
        }

    def stage_encode(self, results: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
        from .encode import encode_file, encode_file_hf

        d = self.work / "bpe"
        model = self.work / "vocab" / "spm.model"
        names = self.split_names(results)
        splits = results["split"]["splits"]
        total = sum(splits[name]["lines"] + splits[name]["documents"] - 1 for name in names)
        max_pieces = self.opts.max_line_pieces
        counts = {}
        with tqdm(total=total, desc="encode", unit=" lines", disable=None) as bar:
            for name in names:
                dst = d / f"{name}.bpe"
                src = self.work / "split" / f"{name}.txt"
                stats = d / f"{name}.counts.json"
                # The runner keeps this folder only for a restart with the same
                # fingerprint: a split finished then is still right.
                if dst.exists() and stats.exists():
                    logger.info("encode %s: reusing %s", name, dst)
                    counts[name] = rec.read_json(stats)
                    bar.update(counts[name]["input_lines"])
                    continue
                with writing(dst), atomic_path(dst) as tmp:
                    if self.opts.tokenizer:
                        counts[name] = encode_file_hf(
                            src, tmp, self.work / "vocab" / "tokenizer", progress=bar, max_pieces=max_pieces
                        )
                    else:
                        counts[name] = encode_file(
                            src, tmp, model, self.opts.workers, progress=bar, max_pieces=max_pieces
                        )
                    # The counts first: a .bpe in place always has its counts beside it.
                    with writing(stats):
                        write_json_atomic(stats, counts[name])
        cut = sum(c["lines_cut"] for c in counts.values())
        added = sum(c["chunks_added"] for c in counts.values())
        # the extract's count: the split files' text lines, without the empty line between two
        # documents (``input_lines`` counts those too, and only text lines can be cut)
        lines = sum(splits[name]["lines"] for name in names)
        if max_pieces:
            logger.info(
                "encode: %d of %d lines were longer than --max-line-pieces %d pieces and were "
                "cut into chunks (%d extra lines)",
                cut,
                lines,
                max_pieces,
                added,
            )
        return counts

    def stage_binarize(self, results: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
        from .binarize import binarize_file

        d = self.work / "bin"
        dict_path = self.work / "vocab" / "dict.txt"
        counts = {}
        for name in tqdm(self.split_names(results), desc="binarize", unit=" splits", disable=None):
            tmp_prefix = d / f"{name}.tmp"
            with writing(d / f"{name}.bin"):
                seqs, toks = binarize_file(self.work / "bpe" / f"{name}.bpe", dict_path, tmp_prefix, self.opts.workers)
                # .idx last: fairseq opens a dataset through its index.
                rec.move_into(d / f"{name}.tmp.bin", d / f"{name}.bin")
                rec.move_into(d / f"{name}.tmp.idx", d / f"{name}.idx")
            counts[name] = {"sequences": seqs, "tokens": toks}
        return counts

    def stage_finalize(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from seed_fairseq.base.vocabulary.dictionary import dictionary_sha256

        a, out = self.opts, self.out
        names = self.split_names(results)
        tokenizer_files = results["vocab"]["tokenizer_files"] if a.tokenizer else None
        planned = rec.planned_outputs(a.shards, names, tokenizer_files)
        state = rec.WorkState.load(out)
        owned = set(state.outputs)
        # A file of the user's put in OUT during the build is never replaced.
        check_collisions(out, planned, owned)
        # Files an interrupted finalize with other splits left (e.g. valid.bin
        # before --valid-docs 0): this build's to delete, and not part of it.
        rec.delete_outputs(out, sorted(owned - set(planned)))
        # Claimed before anything is written: whatever a kill leaves in OUT is
        # listed as the tool's.
        state.outputs = planned
        with writing(state.path):
            state.save()

        # Everything is prepared under .work and renamed into OUT: no temporary
        # file is ever left in OUT itself.
        staging = self.work / "final"
        shutil.rmtree(staging, ignore_errors=True)
        vocab_dir = self.work / "vocab"
        # Each shard is a complete fairseq data dir of its own (dict + spm or the id record beside it).
        copies = [(vocab_dir / rel, rel) for rel in rec.vocab_outputs(1, tokenizer_files)]
        shard_files = rec.TOKENIZER_SHARD_FILES if a.tokenizer else rec.SPM_SHARD_FILES
        if a.shards > 1:
            copies += [(vocab_dir / name, f"shard{k}/{name}") for k in range(a.shards) for name in shard_files]
        for src, rel in copies:
            with writing(out / rel):
                copy_atomic(src, staging / rel)
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                rec.move_into(staging / rel, out / rel)
        for name in names:
            prefix = rec.split_prefix(name, a.shards)
            for ext in (".bin", ".idx"):
                src, dst = self.work / "bin" / f"{name}{ext}", out / (prefix + ext)
                dst.parent.mkdir(parents=True, exist_ok=True)
                # Moves are idempotent so an interrupted finalize can simply run
                # again: a missing source was moved by it (the binarize marker
                # vouches that it is this build's).
                if src.exists():
                    with writing(dst):
                        rec.move_into(src, dst)
                elif not dst.exists():
                    raise FileNotFoundError(src)
        record = rec.build_record(
            a,
            self.identities,
            results,
            config=self.config(),
            fingerprints=self.runner.fingerprints,
            outputs=planned,
            input_files=dict(self.hasher.used),
            dictionary_sha256=dictionary_sha256(out / "dict.txt"),
        )
        with writing(out / RECORD):
            rec.write_record(out, record, staging)
        shutil.rmtree(staging, ignore_errors=True)
        if not a.keep_work:
            rec.remove_work(out)
        return record
