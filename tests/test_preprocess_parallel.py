"""Preprocessing in parallel writes the same bytes as one worker, and the same bytes as
fairseq's own binarizer / the line-by-line sentencepiece encoding it replaces.

Chunks are made tiny (a few hundred bytes) so that even these small inputs are cut
into many chunks, with several in flight per worker.
"""

import json

import numpy as np
import pytest
import sentencepiece as spm
from helpers import DEMO_CORPUS

from preprocess.binarize import binarize_file
from preprocess.encode import cut_pieces, encode_file
from preprocess.errors import PreprocessError
from preprocess.extract import extract
from preprocess.text import normalize_line
from preprocess.vocab import train_spm, write_fairseq_dict

WORKERS = (1, 2, 3)


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    """The demo corpus normalised, one sentence per line (blank line between documents), and a
    303-piece model of it."""
    d = tmp_path_factory.mktemp("spm")
    text = DEMO_CORPUS.read_text(encoding="utf-8").replace(". ", ".\n")
    lines = [normalize_line(line) for line in text.split("\n")]
    (d / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (d / "spm.model").write_bytes(train_spm(d / "corpus.txt", 303, 1))
    write_fairseq_dict(spm.SentencePieceProcessor(model_file=str(d / "spm.model")), d / "dict.txt")
    return d


def fairseq_binarize(encoded, dict_path, prefix):
    """fairseq's FileBinarizer + VocabularyDatasetBinarizer: what fairseq-preprocess runs."""
    from fairseq.binarizer import FileBinarizer, VocabularyDatasetBinarizer
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(str(dict_path))
    return FileBinarizer.multiprocess_dataset(
        str(encoded),
        "mmap",
        VocabularyDatasetBinarizer(dictionary, append_eos=True),
        str(prefix),
        vocab_size=len(dictionary),
        num_workers=1,
    )


def _bytes(prefix):
    return (prefix.parent / (prefix.name + ".bin")).read_bytes(), (prefix.parent / (prefix.name + ".idx")).read_bytes()


def test_encode_same_bytes_for_any_workers_and_as_line_by_line(spm_dir, tmp_path):
    sp = spm.SentencePieceProcessor(model_file=str(spm_dir / "spm.model"))
    src = spm_dir / "corpus.txt"
    # the reference: one line at a time, cut at 120 pieces (some lines are cut)
    expected = []
    for line in src.read_text(encoding="utf-8").split("\n")[:-1]:
        chunks = cut_pieces(sp.encode(line, out_type=str), 120) if line else [[]]
        expected += [" ".join(c) for c in chunks]
    expected = "".join(line + "\n" for line in expected)
    results = []
    for workers in WORKERS:
        dst = tmp_path / f"w{workers}.bpe"
        counts = encode_file(src, dst, spm_dir / "spm.model", workers, chunk_bytes=300, max_pieces=120)
        assert dst.read_text(encoding="utf-8") == expected, workers
        results.append(counts)
    assert results[0] == results[1] == results[2]
    assert 50 < results[0]["lines_cut"] < results[0]["input_lines"] - 50  # both paths taken
    assert results[0]["lines"] == len(expected.split("\n")) - 1


def _encoded_with_edge_cases(spm_dir, path):
    """The encoded corpus plus an empty line, a literal <unk> piece, CR, CRLF and a last line without "\\n"."""
    text = (spm_dir / "corpus.txt").read_text(encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(spm_dir / "spm.model"))
    lines = [" ".join(sp.encode(line, out_type=str)) for line in text.split("\n")[:-1]]
    lines[3] = ""
    lines[5] = lines[5] + " <unk>"
    lines[7] = lines[7].replace(" ", "\r", 1)  # a lone CR ends a line in fairseq's text-mode reading
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(lines[:50]) + "\r\n" + "\n".join(lines[50:]))
    return path


def test_binarize_same_bytes_as_fairseq_for_any_workers(spm_dir, tmp_path):
    encoded = _encoded_with_edge_cases(spm_dir, tmp_path / "corpus.bpe")
    summary = fairseq_binarize(encoded, spm_dir / "dict.txt", tmp_path / "fairseq")
    assert not summary.num_replaced
    expected = _bytes(tmp_path / "fairseq")
    for workers in WORKERS:
        prefix = tmp_path / f"ours{workers}"
        seqs, toks = binarize_file(encoded, spm_dir / "dict.txt", prefix, workers, chunk_bytes=200)
        assert _bytes(prefix) == expected, workers
        assert (seqs, toks) == (summary.num_seq, summary.num_tok)
        assert not (tmp_path / f"ours{workers}.sizes.tmp").exists()


def test_binarize_wide_vocabulary_and_empty_file(tmp_path):
    """Over 65500 symbols fairseq stores uint32 tokens; an empty file gives an empty dataset."""
    symbols = [f"s{i}" for i in range(65600)]
    dict_path = tmp_path / "dict.txt"
    dict_path.write_text("".join(f"{s} 1\n" for s in symbols), encoding="utf-8")
    rng = np.random.default_rng(0)
    lines = [" ".join(symbols[j] for j in rng.integers(0, len(symbols), rng.integers(0, 12))) for _ in range(300)]
    encoded = tmp_path / "wide.bpe"
    encoded.write_text("\n".join(lines) + "\n", encoding="utf-8")
    empty = tmp_path / "empty.bpe"
    empty.write_text("", encoding="utf-8")
    for src in (encoded, empty):
        fairseq_binarize(src, dict_path, tmp_path / f"fairseq_{src.stem}")
        for workers in (1, 2):
            prefix = tmp_path / f"ours_{src.stem}{workers}"
            binarize_file(src, dict_path, prefix, workers, chunk_bytes=500)
            assert _bytes(prefix) == _bytes(tmp_path / f"fairseq_{src.stem}"), (src.name, workers)
    assert len(_bytes(tmp_path / "ours_wide1")[0]) == 4 * (sum(len(line.split()) for line in lines) + len(lines))


def test_binarize_refuses_pieces_missing_from_the_dictionary(spm_dir, tmp_path):
    a, b, c = [line.split()[0] for line in (spm_dir / "dict.txt").read_text(encoding="utf-8").splitlines()[10:13]]
    encoded = tmp_path / "bad.bpe"
    encoded.write_text(f"{a} {b}\n{a} NOT-A-PIECE {c} NOT-A-PIECE\nALSO-NOT\n", encoding="utf-8")
    with pytest.raises(PreprocessError, match=r"3 pieces are not in .*NOT-A-PIECE.*ALSO-NOT"):
        binarize_file(encoded, spm_dir / "dict.txt", tmp_path / "bad", 2, chunk_bytes=20)


def test_extract_same_bytes_for_any_workers(tmp_path, monkeypatch):
    from test_preprocess import SYNTH_PAGES, mediawiki_xml
    from test_wiki_parser import HAND_WRITTEN

    import preprocess.extract as extract_mod

    monkeypatch.setattr(extract_mod, "_TASK_CHARS", 500)  # many small tasks, several in flight per worker
    dump = tmp_path / "wiki.xml"
    pages = SYNTH_PAGES + [(f"P{i}", 0, text) for i, text in enumerate(HAND_WRITTEN)]
    dump.write_bytes(mediawiki_xml(pages * 3))
    text = tmp_path / "text.txt"
    text.write_text(DEMO_CORPUS.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    runs = []
    for workers in WORKERS:
        out = tmp_path / f"corpus{workers}.txt"
        stats = {}
        totals = extract(
            [("wiki", dump), ("text", text)], out, {"lowercase": True, "nfkc": True}, workers, False, stats
        )
        runs.append((out.read_bytes(), totals, json.dumps(stats, sort_keys=True)))
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][1]["documents"] > 20
