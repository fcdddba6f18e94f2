"""Tests of preprocess/: raw dumps and text -> sentencepiece BPE -> fairseq mmap data.

The real-data tests use ../shared/data/enwiki-sample-206-pages.xml.bz2 (beside
the repo) and skip cleanly without it; everything else builds small fixtures
in tmp_path. Module-scoped wiki builds are shared by the real-data tests: the
default one (one sentence per line) and one with --line-unit paragraph and a
tiny --max-line-pieces (two wiki builds instead of three: the test time).
"""

import bz2
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import sentencepiece as spm
from helpers import fairseq_train
from objectives import tiny_encoder

from preprocess import build as build_mod
from preprocess.encode import cut_pieces
from preprocess.text import normalize_line, paragraph_lines, split_sentences
from preprocess.vocab import fairseq_to_spm_id, spm_to_fairseq_id

REPO = Path(__file__).resolve().parents[1]
WIKI_SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "enwiki-sample-206-pages.xml.bz2"
BIN = Path(sys.executable).parent
MARKUP = ("[[", "]]", "{{", "}}", "<ref", "|}")
TINY_TRAIN = [
    *tiny_encoder(layers=1),
    "--tokens-per-sample",
    "64",
    "--max-positions",
    "64",
    "--max-update",
    "3",
    "--batch-size",
    "4",
    "--cpu",
    "--no-save",
    "--optimizer",
    "adam",
    "--lr",
    "1e-4",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--num-workers",
    "0",
    "--skip-invalid-size-inputs-valid-test",
    "--seed",
    "1",
    "--required-batch-size-multiple",
    "1",
]


def run_build(*args, check=True):
    """The CLI as users run it, in a subprocess (exit code, stderr, no traceback)."""
    proc = subprocess.run(
        [sys.executable, "-m", "preprocess.build", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"),
    )
    if check:
        assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return proc


def build_inprocess(capsys, *args):
    """main() in-process: fast for the many error cases; returns (exit code, stderr)."""
    code = build_mod.main([str(a) for a in args])
    return code, capsys.readouterr().err


def read_lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def decode_split(prefix, out):
    """fairseq's own reader + dictionary + spm decode: the text a split holds."""
    from fairseq.data import Dictionary
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    dictionary = Dictionary.load(str(out / "dict.txt"))
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    ds = MMapIndexedDataset(str(prefix))
    lines = []
    for i in range(len(ds)):
        ids = ds[i].tolist()
        assert ids[-1] == dictionary.eos()
        lines.append(sp.decode([fairseq_to_spm_id(t) for t in ids[:-1]]))
    return lines


def read_documents(path):
    """The documents of a split text file, each as its lines joined by one space."""
    text = Path(path).read_text(encoding="utf-8")
    return [" ".join(doc.split("\n")) for doc in text.rstrip("\n").split("\n\n")]


def decode_documents(prefix, out):
    """Each document of a binarized split decoded from all its items' pieces together.

    Documents are separated by the one-token item [</s>]; the items of a
    document are concatenated piece by piece (no separator), so lines cut
    into chunks join back exactly, and whole lines (each starting with "▁")
    join with one space.
    """
    from fairseq.data import Dictionary
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    dictionary = Dictionary.load(str(out / "dict.txt"))
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    ds = MMapIndexedDataset(str(prefix))
    docs, current = [], []
    for i in range(len(ds)):
        ids = ds[i].tolist()
        assert ids[-1] == dictionary.eos()
        if len(ids) == 1:
            docs.append(current)
            current = []
        else:
            current += [fairseq_to_spm_id(t) for t in ids[:-1]]
    docs.append(current)
    return [sp.decode(ids) for ids in docs]


def files_of(directory):
    """{relative path: bytes} of every file, for byte-for-byte comparisons."""
    directory = Path(directory)
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wiki_out(tmp_path_factory):
    if not WIKI_SAMPLE.exists():
        pytest.skip(f"{WIKI_SAMPLE} not present (../shared beside the repo)")
    out = tmp_path_factory.mktemp("wiki") / "data-bin"
    run_build(
        "--wiki",
        WIKI_SAMPLE,
        "--out",
        out,
        "--vocab-size",
        1000,
        "--workers",
        2,
        "--valid-docs",
        5,
        "--test-docs",
        5,
        "--keep-work",
    )
    return out


TINY_MAX_PIECES = 20


@pytest.fixture(scope="module")
def wiki_para_out(tmp_path_factory):
    """Paragraph lines, cut at a tiny number of pieces: the hardest case for "nothing is lost"."""
    if not WIKI_SAMPLE.exists():
        pytest.skip(f"{WIKI_SAMPLE} not present (../shared beside the repo)")
    out = tmp_path_factory.mktemp("wiki_para") / "data-bin"
    run_build(
        "--wiki",
        WIKI_SAMPLE,
        "--out",
        out,
        "--vocab-size",
        1000,
        "--workers",
        2,
        "--valid-docs",
        5,
        "--test-docs",
        5,
        "--keep-work",
        "--line-unit",
        "paragraph",
        "--max-line-pieces",
        TINY_MAX_PIECES,
    )
    return out


BOOKS = {
    "b1.txt": "Chapter One\r\n\r\nThe CAFÉ opened at 9:30, said Zoë.\r\nＦｕｌｌｗｉｄｔｈ text and ﬁ ligature.\r\n",
    "b2.txt": "It was a dark   and stormy night;\n\n\nthe rain fell in torrents — except at occasional intervals.\n",
    "sub/b3.txt": "Numbers: 3.14159, 2,718 and 1e-9.\nPunctuation!? (yes) [no] {maybe} \"quoted\" 'single'.\n",
}


def make_text_corpus(path, docs=40, seed=0):
    """A ready corpus: paragraphs per line, blank line between documents."""
    import random

    rng = random.Random(seed)
    words = (
        "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain "
        "city music science history garden über café naïve 42 1999 3.5 — !? , ."
    ).split()
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for d in range(docs):
            if d:
                f.write("\n")
            for _ in range(rng.randint(1, 4)):
                f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))).capitalize() + "\n")


@pytest.fixture
def books_dir(tmp_path):
    d = tmp_path / "books"
    for name, content in BOOKS.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(content.encode("utf-8"))
    return d


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    make_text_corpus(path)
    return path


SMALL = ["--vocab-size", 400, "--workers", 2, "--valid-docs", 2, "--test-docs", 2]


def mediawiki_xml(pages):
    """A minimal MediaWiki export; pages = [(title, ns, text or None for a redirect)]."""
    parts = [
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">',
        "<siteinfo><sitename>Test</sitename></siteinfo>",
    ]
    for i, (title, ns, text) in enumerate(pages):
        redirect = '<redirect title="Elsewhere" />' if text is None else ""
        body = "#REDIRECT [[Elsewhere]]" if text is None else text
        body = body.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        parts.append(
            f"<page><title>{title}</title><ns>{ns}</ns><id>{i + 1}</id>{redirect}"
            f'<revision><id>{100 + i}</id><text xml:space="preserve">{body}</text></revision></page>'
        )
    parts.append("</mediawiki>")
    return "\n".join(parts).encode("utf-8")


SYNTH_PAGES = [
    (
        "Alpha",
        0,
        "'''Alpha''' is a [[letter]] {{citation needed}}.<ref>A source.</ref>\n\n"
        "== History ==\nIt came from [[Phoenicia|the Phoenicians]].\n\n"
        '{| class="wikitable"\n|-\n| cell || cell\n|}\n\n[[Category:Letters]]\n'
        "[[File:Alpha.png|thumb|An alpha]]\n== References ==\n{{reflist}}\n",
    ),
    ("Beta", 0, "'''Beta''' is the second letter. It is used in [[mathematics]] and physics.\n"),
    ("Gamma", 0, None),
    ("Talk:Alpha", 1, "Discussion, not an article."),
    ("Delta", 0, "Delta is a river landform, for example the Nile delta. Sediment builds it.\n"),
    ("Epsilon", 0, "Epsilon denotes a small positive quantity in analysis and calculus.\n"),
    ("Zeta", 0, "The Riemann zeta function is central to analytic number theory.\n"),
]


# ---- unit tests: normalisation and the id rule ----------------------------------------------


def test_normalize_line():
    assert normalize_line("  The\u00a0CAFÉ\t\tis   ＯＰＥＮ\u2028now \x07 ") == "the café is open now"
    assert normalize_line("ﬁne", lowercase=False) == "fine"
    assert normalize_line("Keep Case", lowercase=False, nfkc=False) == "Keep Case"
    assert normalize_line(" \u3000 \x0b") == ""
    for s in ("İstanbul Ǆ ﬀ ℌ Ⅻ ǅ ẞ ᴬ", "x\u0301y ½ ¹ ™", "Σίσυφος ΟΔΟΣ"):
        once = normalize_line(s)
        assert normalize_line(once) == once  # idempotent: safe to apply again downstream


def test_normalize_line_fast_path_equals_the_plain_steps():
    """normalize_line skips the control/whitespace regexes on printable lines: same result as
    NORMALIZATION_STEPS done plainly, on random strings over the first 12k code points."""
    import random
    import re
    import unicodedata

    from seed_fairseq.base.vocabulary.text import CONTROL_CHARACTERS as _CONTROL

    def plain(line, lowercase, nfkc):
        if nfkc:
            line = unicodedata.normalize("NFKC", line)
        if lowercase:
            line = line.lower()
            if nfkc:
                line = unicodedata.normalize("NFKC", line)
        return re.sub(r"\s+", " ", _CONTROL.sub("", line)).strip()

    rng = random.Random(0)
    alphabet = [chr(i) for i in range(0x3100)] + [" "] * 300 + list("aBc") * 100
    for _ in range(30_000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(13)))
        for lowercase in (True, False):
            for nfkc in (True, False):
                assert normalize_line(s, lowercase, nfkc) == plain(s, lowercase, nfkc), repr(s)


def test_spm_to_fairseq_id_rule():
    assert [spm_to_fairseq_id(i) for i in range(6)] == [3, 0, 2, 4, 5, 6]
    for fid in (0, 2, 3, 4, 999):
        assert spm_to_fairseq_id(fairseq_to_spm_id(fid)) == fid
    with pytest.raises(ValueError):
        fairseq_to_spm_id(1)  # <pad> has no sentencepiece id


def test_split_sentences_cuts_only_at_spaces():
    assert split_sentences("Dr. Smith went to Washington. He arrived at 3 p.m. today. It was cold!") == [
        "Dr. Smith went to Washington.",
        "He arrived at 3 p.m. today.",
        "It was cold!",
    ]
    for text in (
        "The U.S. economy grew 3.5% in 2019 (see Fig. 2). Growth slowed.",
        "中文句子。第二句。 Emoji 🎉 ok. Next",
        "one",
        '"Quoted." Then (parenthesis.) after',
    ):
        sentences = split_sentences(text)
        assert " ".join(sentences) == text and all(sentences), sentences
    assert split_sentences("中文句子。第二句。") == ["中文句子。第二句。"]  # no space: not cut


def test_paragraph_lines_join_back_to_the_normalised_paragraph():
    raw = "  Dr. Smith  went HOME.\u00a0He SLEPT!  İstanbul ΟΔΟΣ. Ｆｕｌｌ ﬁne. "
    lines, whole = paragraph_lines(raw)
    # Split on the cased text (capitals help the splitter), then lower-cased.
    assert lines == ["dr. smith went home.", "he slept!", "i̇stanbul οδος.", "full fine."] and not whole
    assert " ".join(lines) == normalize_line(raw)
    assert paragraph_lines(raw, line_unit="paragraph") == ([normalize_line(raw)], False)
    assert paragraph_lines(raw, lowercase=False)[0][0] == "Dr. Smith went HOME."
    assert paragraph_lines(" \u3000 ") == ([], False)


def test_cut_pieces():
    pieces = "▁a b c ▁d e f g h ▁i j".split()
    assert cut_pieces(pieces, 4) == [["▁a", "b", "c"], ["▁d", "e", "f", "g"], ["h", "▁i", "j"]]
    assert cut_pieces(pieces, 0) == [pieces] and cut_pieces(pieces, 11) == [pieces]
    # No word start in reach: do not cut inside a byte-fallback UTF-8 character.
    snowmen = "<0xE2> <0x98> <0x83> <0xE2> <0x98> <0x83>".split()
    assert cut_pieces(snowmen, 4) == [snowmen[:3], snowmen[3:]]
    import random

    rng = random.Random(0)
    vocab = ["▁a", "b", "▁", "<0xE2>", "<0x98>", "<0x83>", "c"]
    for _ in range(3000):
        p = [rng.choice(vocab) for _ in range(rng.randint(1, 60))]
        n = rng.randint(1, 12)
        chunks = cut_pieces(p, n)
        assert sum(chunks, []) == p and all(1 <= len(c) <= n for c in chunks)


# ---- real Wikipedia sample ------------------------------------------------------------------


def _count_articles_independently(path):
    """Non-redirect pages in the article namespace, counted without preprocess code."""
    n = 0
    with bz2.open(path) as f:
        for _, elem in ET.iterparse(f):
            if elem.tag.endswith("}page"):
                ns = elem.find("{*}ns").text
                if ns == "0" and elem.find("{*}redirect") is None:
                    n += 1
                elem.clear()
    return n


def test_wiki_articles_all_come_out(wiki_out):
    expected = _count_articles_independently(WIKI_SAMPLE)
    assert expected > 100
    record = json.loads((wiki_out / "preprocess.json").read_text())
    docs = record["documents"]
    assert docs["documents"] + docs["empty_documents_dropped"] == expected
    assert docs["documents"] >= expected - 2  # cleaning must not empty real articles
    splits = record["splits"]
    assert sum(s["documents"] for s in splits.values()) == docs["documents"]
    assert splits["valid"]["documents"] == 5 and splits["test"]["documents"] == 5
    # Each document is one blank-line separated block of the split files.
    texts = [(wiki_out / ".work" / "split" / f"{n}.txt").read_text(encoding="utf-8") for n in splits]
    assert sum(len([d for d in t.split("\n\n") if d.strip()]) for t in texts) == docs["documents"]


def test_wiki_no_markup_survives(wiki_out):
    lines = []
    for path in sorted((wiki_out / ".work" / "split").glob("*.txt")):
        lines += read_lines(path)
    assert len(lines) > 5000
    for line in lines:
        for token in MARKUP:
            assert token not in line, (token, line[:300])
        assert line == normalize_line(line)  # normalised: lower-case, NFKC, clean spaces
    text = "\n".join(lines)
    assert "anarchism is a political philosophy" in text
    assert "thumb|" not in text and "category:" not in text


def test_wiki_decoding_train_split_reproduces_text(wiki_out):
    record = json.loads((wiki_out / "preprocess.json").read_text())
    assert record["normalization"]["line_unit"] == "sentence" and record["lines"]["max_line_pieces"] == 510
    for name, prefix in (("train0", "train"), ("valid", "valid")):
        text = wiki_out / ".work" / "split" / f"{name}.txt"
        assert decode_documents(wiki_out / prefix, wiki_out) == read_documents(text)
        if record["splits"][name]["lines_cut"] == 0:  # then also line by line
            assert decode_split(wiki_out / prefix, wiki_out) == read_lines(text)


def test_wiki_sentence_lines_vs_paragraph_lines(wiki_out, wiki_para_out):
    sent = json.loads((wiki_out / "preprocess.json").read_text())
    para = json.loads((wiki_para_out / "preprocess.json").read_text())
    assert para["normalization"]["line_unit"] == "paragraph" and para["lines"]["sentence_splitter"] is None
    assert sent["documents"]["documents"] == para["documents"]["documents"]
    # Same paragraphs; in sentence mode most are several lines.
    assert sent["lines"]["paragraphs"] == para["lines"]["paragraphs"] == para["lines"]["lines"]
    assert sent["lines"]["lines"] > 2 * para["lines"]["lines"]
    assert sent["lines"]["paragraphs_kept_whole"] <= 3
    for name, prefix in (("train0", "train"), ("valid", "valid"), ("test", "test")):
        assert sent["splits"][name]["documents"] == para["splits"][name]["documents"]
        assert sent["splits"][name]["lines"] > para["splits"][name]["lines"]
        # Decoding the sentence-mode data gives the normalised paragraphs of each
        # document (lines joined by one space).
        expected = read_documents(wiki_para_out / ".work" / "split" / f"{name}.txt")
        assert read_documents(wiki_out / ".work" / "split" / f"{name}.txt") == expected
        assert decode_documents(wiki_out / prefix, wiki_out) == expected
    # Sentence lines with the default cap: no item is longer than a 511-token block.
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    ds = MMapIndexedDataset(str(wiki_out / "train"))  # keep it alive while .sizes is read
    assert ds.sizes.max() <= 510 + 1


def test_wiki_tiny_max_line_pieces_loses_nothing(wiki_para_out):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    out = wiki_para_out
    record = json.loads((out / "preprocess.json").read_text())
    lines = record["lines"]
    assert lines["max_line_pieces"] == TINY_MAX_PIECES and record["config"]["max_line_pieces"] == TINY_MAX_PIECES
    assert lines["lines_cut"] > 1000 and lines["chunks_added"] > lines["lines_cut"]
    assert lines["lines_cut"] == sum(s["lines_cut"] for s in record["splits"].values())
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    for name, prefix in (("train0", "train"), ("valid", "valid"), ("test", "test")):
        ds = MMapIndexedDataset(str(out / prefix))
        assert ds.sizes.max() <= TINY_MAX_PIECES + 1  # pieces + </s>
        split = record["splits"][name]
        assert split["sequences"] == split["lines"] + split["documents"] - 1 + split["chunks_added"]
        text = out / ".work" / "split" / f"{name}.txt"
        assert decode_documents(out / prefix, out) == read_documents(text)
    # Piece for piece: the chunks of the train split are the pieces of its lines, in order.
    expected = [
        spm_to_fairseq_id(i) for line in read_lines(out / ".work" / "split" / "train0.txt") for i in sp.encode(line)
    ]
    ds = MMapIndexedDataset(str(out / "train"))
    got = [t for i in range(len(ds)) for t in ds[i].tolist()[:-1]]
    assert got == expected
    # Chunks end at word starts where they can: most begin with "▁".
    bpe = read_lines(out / ".work" / "bpe" / "train0.bpe")
    assert sum(line.startswith("▁") for line in bpe if line) > 0.95 * sum(1 for line in bpe if line)


def test_wiki_document_boundaries_for_complete_doc(wiki_out):
    from fairseq.data import Dictionary, TokenBlockDataset
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    record = json.loads((wiki_out / "preprocess.json").read_text())
    n_docs = record["splits"]["train0"]["documents"]
    dictionary = Dictionary.load(str(wiki_out / "dict.txt"))
    ds = MMapIndexedDataset(str(wiki_out / "train"))
    # A blank line became the one-token sequence [</s>]: the separator complete_doc needs.
    separators = [i for i in range(len(ds)) if ds.sizes[i] == 1]
    assert len(separators) == n_docs - 1
    assert all(ds[i].tolist() == [dictionary.eos()] for i in separators)
    blocks = TokenBlockDataset(
        ds, ds.sizes, 10**8, pad=dictionary.pad(), eos=dictionary.eos(), break_mode="complete_doc", document_sep_len=1
    )
    assert len(blocks) == n_docs  # one block per document when blocks are unbounded


def test_wiki_dict_matches_spm_and_record(wiki_out):
    from fairseq.data import Dictionary

    sp = spm.SentencePieceProcessor(model_file=str(wiki_out / "spm.model"))
    dictionary = Dictionary.load(str(wiki_out / "dict.txt"))
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    assert len(dictionary) == sp.get_piece_size() + 1  # + <pad>; <mask> comes from the task
    for i in range(sp.get_piece_size()):
        assert dictionary.index(sp.id_to_piece(i)) == spm_to_fairseq_id(i), i
    assert not any("madeupword" in dictionary[i] for i in range(len(dictionary)))
    record = json.loads((wiki_out / "preprocess.json").read_text())
    assert record["normalization"]["lowercase"] is True and record["normalization"]["nfkc"] is True
    assert record["sentencepiece"]["vocab_size"] == 1000
    assert record["fairseq_dictionary"]["mask_index"] == 1001


ID_STRINGS = [
    "Café naïve résumé Zoë façade",
    "Digits 0123456789 3.14159 1,000,000 2024-01-01",
    "Punctuation: ,.;:!?()[]{}<>\"'`~@#$%^&*-_=+/\\|",
    "Unicode: Ελληνικά русский 中文 日本語 한국어 עברית العربية",
    "Emoji 🎉🚀 and symbols ∑∫√∞ ☃",
    "",
    "</s> <s> <unk> <pad> <mask> look like specials but are text",
]


def test_id_mapping_equals_fairseq_preprocess(wiki_out, tmp_path):
    """spm ids through spm_to_fairseq_id == what the real fairseq-preprocess CLI wrote."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from preprocess.binarize import binarize_file

    sp = spm.SentencePieceProcessor(model_file=str(wiki_out / "spm.model"))
    normalized = [normalize_line(s) for s in ID_STRINGS]
    encoded = tmp_path / "ids.bpe"
    encoded.write_text("".join(" ".join(sp.encode(s, out_type=str)) + "\n" for s in normalized), encoding="utf-8")
    dest = tmp_path / "fs"
    proc = subprocess.run(
        [
            BIN / "fairseq-preprocess",
            "--only-source",
            "--srcdict",
            wiki_out / "dict.txt",
            "--trainpref",
            encoded,
            "--destdir",
            dest,
            "--dataset-impl",
            "mmap",
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = MMapIndexedDataset(str(dest / "train"))
    assert len(ds) == len(ID_STRINGS)
    for i, s in enumerate(normalized):
        expected = [spm_to_fairseq_id(t) for t in sp.encode(s)] + [2]
        assert ds[i].tolist() == expected, ID_STRINGS[i]
    assert ds[normalized.index("")].tolist() == [2]  # empty line -> [</s>]
    assert "0.0% replaced" in proc.stderr + proc.stdout  # nothing became <unk>
    # Our in-process binarizer writes the same bytes as the CLI.
    binarize_file(encoded, wiki_out / "dict.txt", tmp_path / "ours", workers=2)
    assert (tmp_path / "ours.bin").read_bytes() == (dest / "train.bin").read_bytes()
    assert (tmp_path / "ours.idx").read_bytes() == (dest / "train.idx").read_bytes()


def test_fairseq_train_masked_lm_on_wiki(wiki_out, tmp_path):
    proc = subprocess.run(
        [
            BIN / "fairseq-train",
            wiki_out,
            "--task",
            "masked_lm",
            "--arch",
            "roberta_base",
            "--criterion",
            "masked_lm",
            "--sample-break-mode",
            "complete_doc",
            *TINY_TRAIN,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # fairseq creates ./checkpoints even with --no-save
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "num_updates=3" in proc.stdout + proc.stderr


def _seed_plugin_ready():
    proc = subprocess.run(
        [
            BIN / "fairseq-train",
            "--user-dir",
            REPO / "seed_fairseq",
            "--task",
            "seed_pretrain",
            "--arch",
            "seed_encoder_tiny",
            "--criterion",
            "seed_pretrain",
            "--help",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return proc.returncode == 0


def test_fairseq_train_seed_pretrain_on_wiki(wiki_out, tmp_path):
    if not _seed_plugin_ready():
        pytest.skip("seed_fairseq plugin (task seed_pretrain, arch seed_encoder_tiny) not available yet")
    proc = subprocess.run(
        fairseq_train(
            wiki_out,
            "--task", "seed_pretrain", "--arch", "seed_encoder_tiny", "--criterion", "seed_pretrain",
            "--tokens-per-sample", "64", "--max-update", "3", "--batch-size", "4", "--cpu", "--no-save",
            "--optimizer", "adam", "--lr", "1e-4", "--log-format", "simple", "--log-interval", "1",
            "--num-workers", "0", "--skip-invalid-size-inputs-valid-test",
        ),  # fmt: skip
        capture_output=True,
        text=True,
        cwd=tmp_path,  # fairseq creates ./checkpoints even with --no-save
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "num_updates=3" in proc.stdout + proc.stderr


# ---- BookCorpus-style and plain-text inputs -------------------------------------------------


def test_books_and_text_inputs(tmp_path, books_dir, text_file):
    out = tmp_path / "out"
    run_build("--books", books_dir, "--text", text_file, "--out", out, *SMALL, "--keep-work")
    record = json.loads((out / "preprocess.json").read_text())
    assert record["documents"]["documents"] == 3 + 40  # one per book + the text's documents
    assert record["sources"][0]["stats"]["files"] == 3
    assert "wiki_cleaner" not in record["config"]  # no dump: the record is what it was before the option
    corpus = (out / ".work" / "extract" / "corpus.txt").read_text(encoding="utf-8")
    docs = corpus.split("\n\n")
    # Books come first, in sorted path order; blank lines inside a book are dropped.
    assert docs[0] == ("chapter one\nthe café opened at 9:30, said zoë.\nfullwidth text and fi ligature.")
    assert docs[1].startswith("it was a dark and stormy night;\nthe rain fell")
    assert docs[2].startswith("numbers: 3.14159")
    assert "\r" not in corpus and not corpus.startswith("\n")
    assert corpus.endswith("\n") and not corpus.endswith("\n\n")
    for name in ("train", "valid", "test"):
        assert decode_split(out / name, out) == read_lines(
            out / ".work" / "split" / f"{name}0.txt" if name == "train" else out / ".work" / "split" / f"{name}.txt"
        )


def test_unknown_policy_without_byte_fallback(tmp_path, text_file):
    """--no-byte-fallback: unseen characters become spm <unk> (0) = fairseq 3."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    out = tmp_path / "out"
    run_build(
        "--text",
        text_file,
        "--out",
        out,
        *SMALL,
        "--no-byte-fallback",
        "--character-coverage",
        1.0,
        "--vocab-size",
        150,
    )
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    ids = sp.encode(normalize_line("alpha ☃ beta"))
    assert 0 in ids
    encoded = tmp_path / "unk.bpe"
    encoded.write_text(" ".join(sp.id_to_piece(i) for i in ids) + "\n", encoding="utf-8")
    from preprocess.binarize import binarize_file

    binarize_file(encoded, out / "dict.txt", tmp_path / "unk", workers=1)
    assert MMapIndexedDataset(str(tmp_path / "unk"))[0].tolist() == [spm_to_fairseq_id(i) for i in ids] + [2]
    assert 3 in [spm_to_fairseq_id(i) for i in ids]


def test_shards_layout_and_training(tmp_path, text_file):
    out = tmp_path / "out"
    run_build("--text", text_file, "--out", out, *SMALL, "--shards", 2)
    for k in (0, 1):
        shard = out / f"shard{k}"
        assert (shard / "dict.txt").read_bytes() == (out / "dict.txt").read_bytes()
        assert (shard / "train.bin").exists() and (shard / "train.idx").exists()
    assert (out / "shard0" / "valid.idx").exists() and not (out / "shard1" / "valid.idx").exists()
    record = json.loads((out / "preprocess.json").read_text())
    assert record["splits"]["train0"]["documents"] + record["splits"]["train1"]["documents"] == 36
    assert abs(record["splits"]["train0"]["documents"] - record["splits"]["train1"]["documents"]) <= 1
    proc = subprocess.run(
        [
            BIN / "fairseq-train",
            f"{out / 'shard0'}:{out / 'shard1'}",
            "--task",
            "masked_lm",
            "--arch",
            "roberta_base",
            "--criterion",
            "masked_lm",
            *TINY_TRAIN,
            "--max-epoch",
            "2",
            "--max-update",
            "1000",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # fairseq creates ./checkpoints even with --no-save
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    # Epoch 1 reads shard0's train, epoch 2 shard1's; valid always comes from shard0.
    assert f"from: {out / 'shard0' / 'train'}" in log and f"from: {out / 'shard1' / 'train'}" in log
    assert f"from: {out / 'shard0' / 'valid'}" in log


@pytest.mark.parametrize("cleaner", ["scanner", "parser"])
def test_synthetic_wiki_cleaning(tmp_path, cleaner):
    dump = tmp_path / "wiki.xml.bz2"
    dump.write_bytes(bz2.compress(mediawiki_xml(SYNTH_PAGES)))
    out = tmp_path / "out"
    run_build(
        "--wiki",
        dump,
        "--out",
        out,
        "--vocab-size",
        300,
        "--workers",
        1,
        "--valid-docs",
        1,
        "--test-docs",
        1,
        "--keep-work",
        "--wiki-cleaner",
        cleaner,
    )
    corpus = (out / ".work" / "extract" / "corpus.txt").read_text(encoding="utf-8")
    docs = corpus.split("\n\n")
    assert len(docs) == 5  # Gamma is a redirect, Talk:Alpha not an article
    assert docs[0] == "alpha is a letter.\nit came from the phoenicians."
    record = json.loads((out / "preprocess.json").read_text())
    stats = record["sources"][0]["stats"]
    assert stats == {"kind": "wiki", "pages": 7, "redirects": 1, "non_article_pages": 1, "articles": 5}
    # the parser is what records without the key meant: they stay the records of the same command
    assert record["config"].get("wiki_cleaner") == (None if cleaner == "parser" else cleaner)


# ---- resume ---------------------------------------------------------------------------------


def test_resume_after_vocab_stage_equals_clean_run(tmp_path, books_dir, text_file):
    args = ["--books", books_dir, "--text", text_file, *SMALL]
    clean = tmp_path / "clean"
    run_build(*args, "--out", clean)

    resumed = tmp_path / "resumed"
    run_build(*args, "--out", resumed, "--stop-after", "vocab")
    assert (resumed / ".work" / "vocab.done").exists()
    assert not (resumed / ".work" / "encode.done").exists()
    # Nothing half-built looks complete: no record, no binarized data yet.
    assert not (resumed / "preprocess.json").exists() and not (resumed / "train.bin").exists()
    # Simulate debris of a kill in the middle of the encode stage.
    (resumed / ".work" / "bpe").mkdir()
    (resumed / ".work" / "bpe" / "train0.bpe.tmp").write_text("garbage\n")

    proc = run_build(*args, "--out", resumed)
    for stage in ("extract", "split", "vocab"):
        assert f"stage {stage}: already done, skipping" in proc.stderr
    assert "stage encode: running" in proc.stderr
    assert files_of(resumed) == files_of(clean)

    again = run_build(*args, "--out", resumed)
    assert "nothing to do" in again.stderr


def test_changed_options_on_unfinished_build_redo_only_their_stages(tmp_path, text_file, capsys, caplog):
    """An unfinished build is not in use: other options are taken without --force,
    and only the stages that read them are redone."""
    caplog.set_level("INFO", logger="preprocess")
    out = tmp_path / "out"
    run_build("--text", text_file, "--out", out, *SMALL, "--stop-after", "split")
    code, err = build_inprocess(
        capsys, "--text", text_file, "--out", out, *SMALL[:-4], "--valid-docs", 3, "--test-docs", 2
    )
    assert code == 0, err
    assert "stage extract: already done" in caplog.text and "stage split: running" in caplog.text
    record = json.loads((out / "preprocess.json").read_text())
    assert record["splits"]["valid"]["documents"] == 3 and record["splits"]["test"]["documents"] == 2


@pytest.mark.parametrize(
    "changed,first_redone", [(["--line-unit", "paragraph"], "extract"), (["--max-line-pieces", 20], "encode")]
)
def test_changed_line_options_are_never_resumed_or_reused(tmp_path, text_file, capsys, caplog, changed, first_redone):
    """--line-unit changes extract's output, --max-line-pieces encode's: a build made
    with other values must not be resumed with stale stages nor taken as complete."""
    caplog.set_level("INFO", logger="preprocess")
    clean = tmp_path / "clean"
    code, err = build_inprocess(capsys, "--text", text_file, "--out", clean, *SMALL, *changed)
    assert code == 0, err
    out = tmp_path / "out"
    run_build("--text", text_file, "--out", out, *SMALL, "--stop-after", "vocab")
    caplog.clear()
    code, err = build_inprocess(capsys, "--text", text_file, "--out", out, *SMALL, *changed)
    assert code == 0, err
    later = build_mod.STAGES[build_mod.STAGES.index(first_redone) :]
    for stage in build_mod.STAGES:
        redone = f"stage {stage}: running" in caplog.text
        assert redone == (stage in later), (stage, caplog.text)
    # Exactly what a clean build with the new value writes: nothing stale was reused.
    assert files_of(out) == files_of(clean)
    # Finished: the old values are another build now, refused without --force.
    code, err = build_inprocess(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 2 and "already holds a build with other inputs or options" in err
    caplog.clear()
    code, err = build_inprocess(capsys, "--text", text_file, "--out", out, *SMALL, "--force")
    assert code == 0 and "stage extract: running" in caplog.text and "already done" not in caplog.text
    record = json.loads((out / "preprocess.json").read_text())
    assert record["config"]["line_unit"] == "sentence" and record["config"]["max_line_pieces"] == 510


def test_line_option_values_are_checked(tmp_path, text_file, capsys):
    for bad in (["--max-line-pieces", -1], ["--line-unit", "word"]):
        with pytest.raises(SystemExit) as e:
            build_inprocess(capsys, "--text", text_file, "--out", tmp_path / "out", *SMALL, *bad)
        assert e.value.code == 2
    assert not (tmp_path / "out").exists()


def test_cli_and_library_call_make_the_same_options(tmp_path):
    """build() and the command line make one BuildOptions; its identity (the record's
    config, hence every fingerprint) keeps the keys and values of every earlier version."""
    from preprocess.options import BuildOptions, parse_args

    argv = ["--text", "c.txt", "--out", str(tmp_path / "o"), "--vocab-size", "500", "--no-lowercase"]
    cli = parse_args(argv + ["--valid-docs", "3", "--wiki", "w.xml", "--wiki-cleaner", "scanner"])
    call = BuildOptions.from_call(
        tmp_path / "o", text=[Path("c.txt")], wiki=["w.xml"], vocab_size=500, lowercase=False, valid_docs=3, nfkc=None
    )
    assert call == cli
    assert cli.identity() == {
        "lowercase": False,
        "nfkc": True,
        "valid_docs": 3,
        "test_docs": None,
        "shards": 1,
        "seed": 1,
        "skip_bad": False,
        "line_unit": "sentence",
        "max_line_pieces": 510,
        "vocab_size": 500,
        "byte_fallback": True,
        "character_coverage": 0.9995,
        "spm_sample_sentences": 1000000,
        "wiki_cleaner": "scanner",
    }
    tok = parse_args(["--text", "c.txt", "--out", "o", "--tokenizer", "t"])
    assert (tok.lowercase, tok.nfkc, tok.vocab_size) == (False, False, 32768)
    assert tok.identity("abc") == dict(
        {k: v for k, v in cli.identity().items() if k not in build_mod.SPM_DEFAULTS and k != "wiki_cleaner"},
        lowercase=False,
        nfkc=False,
        valid_docs=None,
        tokenizer="abc",
    )


def test_preprocess_imports_neither_fairseq_nor_the_plugin():
    """Code that does not use fairseq does not pay for it (issue 22): every module of
    preprocess/ imports without fairseq, the plugin's registration or its patches."""
    code = (
        "import importlib, pkgutil, sys, preprocess\n"
        "for m in pkgutil.iter_modules(preprocess.__path__):\n"
        "    importlib.import_module('preprocess.' + m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'fairseq' or m.startswith("
        "('seed_fairseq.plugin', 'seed_fairseq.compat', 'seed_fairseq.pretrain.fairseq_patches'))]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---- bad input: one clear error, exit code 2, nothing complete-looking ---------------------------


def _assert_clear_error(code, err, path, *words):
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: {path}: "), err
    for w in words:
        assert w in last, (w, last)
    assert "Traceback" not in err


def test_truncated_bz2_cli(tmp_path):
    """Through the real CLI: exit code 2, one line, no traceback, no record left."""
    data = bz2.compress(mediawiki_xml(SYNTH_PAGES * 20))
    dump = tmp_path / "cut.xml.bz2"
    dump.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    proc = run_build("--wiki", dump, "--out", out, *SMALL, check=False)
    _assert_clear_error(proc.returncode, proc.stderr, dump, "truncated")
    assert not (out / "preprocess.json").exists() and not (out / ".work" / "extract.done").exists()


@pytest.mark.skipif(not WIKI_SAMPLE.exists(), reason="real dump not present")
def test_truncated_real_dump(tmp_path, capsys):
    dump = tmp_path / "cut.xml.bz2"
    dump.write_bytes(WIKI_SAMPLE.read_bytes()[:300_000])
    code, err = build_inprocess(capsys, "--wiki", dump, "--out", tmp_path / "out", *SMALL)
    _assert_clear_error(code, err, dump, "truncated .bz2")


@pytest.mark.parametrize(
    "content,words",
    [
        (b'<?xml version="1.0"?><html><body>hello</body></html>', ["not a MediaWiki XML export", "<html>"]),
        (b"just some plain text, not XML at all\n", ["not a well-formed MediaWiki XML export"]),
        (mediawiki_xml(SYNTH_PAGES)[:-200], ["truncated XML"]),
        (mediawiki_xml(SYNTH_PAGES).replace(b"second letter", b"second \xe9letter"), ["non-UTF-8"]),
        (b"", ["empty file"]),
    ],
)
def test_bad_wiki_inputs(tmp_path, capsys, content, words):
    dump = tmp_path / "dump.xml"
    dump.write_bytes(content)
    out = tmp_path / "out"
    code, err = build_inprocess(capsys, "--wiki", dump, "--out", out, *SMALL)
    _assert_clear_error(code, err, dump, *words)
    assert not (out / "preprocess.json").exists()


def test_non_utf8_text_error_and_skip_bad(tmp_path, capsys, text_file):
    bad = tmp_path / "books" / "bad.txt"
    bad.parent.mkdir()
    bad.write_bytes(b"a fine first line\nlatin-1 \xe9t\xe9 line\na fine last line\n")
    out = tmp_path / "out"
    code, err = build_inprocess(capsys, "--books", bad.parent, "--text", text_file, "--out", out, *SMALL)
    _assert_clear_error(code, err, bad, "line 2", "not valid UTF-8", "--skip-bad")
    assert not (out / "preprocess.json").exists()

    # The advice works on the same --out, without --force (see test_faults_preprocess.py).
    code, err = build_inprocess(
        capsys, "--books", bad.parent, "--text", text_file, "--out", out, *SMALL, "--skip-bad", "--keep-work"
    )
    assert code == 0, err
    record = json.loads((out / "preprocess.json").read_text())
    assert record["sources"][0]["stats"]["bad_lines_skipped"] == 1
    corpus = (out / ".work" / "extract" / "corpus.txt").read_text(encoding="utf-8")
    assert corpus.startswith("a fine first line\na fine last line\n\n")


def test_empty_inputs(tmp_path, capsys):
    empty_file = tmp_path / "empty.txt"
    empty_file.write_bytes(b"")
    code, err = build_inprocess(capsys, "--text", empty_file, "--out", tmp_path / "o1", *SMALL)
    _assert_clear_error(code, err, empty_file, "empty file")

    empty_dir = tmp_path / "nobooks"
    empty_dir.mkdir()
    (empty_dir / "notes.md").write_text("not a book")
    code, err = build_inprocess(capsys, "--books", empty_dir, "--out", tmp_path / "o2", *SMALL)
    _assert_clear_error(code, err, empty_dir, "empty directory")

    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n\t\n")
    code, err = build_inprocess(capsys, "--text", blank, "--out", tmp_path / "o3", *SMALL)
    _assert_clear_error(code, err, blank, "no text found")


def test_vocab_size_larger_than_data(tmp_path, capsys, text_file):
    out = tmp_path / "out"
    code, err = build_inprocess(
        capsys,
        "--text",
        text_file,
        "--out",
        out,
        "--vocab-size",
        50000,
        "--workers",
        1,
        "--valid-docs",
        2,
        "--test-docs",
        2,
    )
    _assert_clear_error(
        code, err, out / ".work" / "vocab" / "spm_sample.txt", "--vocab-size 50000 is larger than this data supports"
    )
    assert not (out / ".work" / "vocab.done").exists()
    assert not (out / "dict.txt").exists() and not (out / "preprocess.json").exists()


def test_too_few_documents(tmp_path, capsys, text_file):
    code, err = build_inprocess(
        capsys,
        "--text",
        text_file,
        "--out",
        tmp_path / "out",
        "--vocab-size",
        300,
        "--valid-docs",
        30,
        "--test-docs",
        10,
    )
    _assert_clear_error(code, err, text_file, "only 40 documents")
