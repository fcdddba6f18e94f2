"""Raw text -> the dictionary ids of a data folder, the way its build turned the corpus into ids.

For what reads raw text next to pre-training (``--retrieval-dev``: a labelled dev set scored
with the model being trained), so that a text becomes the ids the model was trained on and
the ids its export will see.  The two kinds of data folder ``preprocess.build`` writes:

* built with ``--tokenizer`` (what continuing an import uses), or an import folder itself:
  ``hf_tokenizer.json`` + ``tokenizer/``: the text goes to that tokenizer as it is (it
  normalises by itself, as in the exported model's evaluation) and its ids are mapped onto
  the dictionary (``tokenizer.py``);
* sentencepiece builds: ``preprocess.json`` + ``spm.model``: the recorded normalisation
  (``text.normalize_line``), the pieces, each piece's dictionary id (an unknown piece is
  ``<unk>``, as fairseq's binarizer does).

Either way a text becomes ``<s> x1 .. xk </s>`` ([CLS] first), cut to at most ``max_len``
ids keeping both ends: what the exported tokenizer gives with ``truncation=True,
max_length=max_len``.
"""

import json
from pathlib import Path
from typing import Callable, List, Sequence

from .text import normalize_line
from .tokenizer import (
    FAIRSEQ_SPECIALS,
    RECORD,
    TOKENIZER_DIR,
    TokenizerError,
    fairseq_to_hf_from_record,
    load_fast_tokenizer,
    load_record,
    vocab_from_tokenizer,
)

BOS, EOS, UNK = 0, 2, 3  # fairseq's <s> (= [CLS]), </s>, <unk>
SPM_RECORD, SPM_MODEL = "preprocess.json", "spm.model"


class TextIds:
    """``texts, max_len -> ids`` of one data folder; ``describe`` says which tokenizer."""

    def __init__(self, bodies: Callable[[List[str]], List[List[int]]], describe: str):
        self._bodies = bodies  # texts -> their ids without <s> and </s>
        self.describe = describe

    def __call__(self, texts: Sequence[str], max_len: int) -> List[List[int]]:
        if max_len < 3:
            raise ValueError(f"max_len must be >= 3 (<s>, a token, </s>), got {max_len}")
        return [[BOS, *body[: max_len - 2], EOS] for body in self._bodies(list(texts))]


def for_data_folder(folder, symbols: Sequence[str]) -> TextIds:
    """The text-to-ids of the data folder whose dictionary (specials and ``<mask>`` included)
    is ``symbols``; :class:`TokenizerError` when the folder has no tokenizer, or one that
    does not give this dictionary's ids."""
    folder = Path(folder)
    try:
        record = load_record(folder)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(folder / RECORD, f"not readable ({e})") from None
    if record is not None:
        return _hf(folder, record, symbols)
    if (folder / SPM_MODEL).is_file() and (folder / SPM_RECORD).is_file():
        return _sentencepiece(folder, symbols)
    raise TokenizerError(
        folder,
        f"no tokenizer to turn text into this folder's ids: neither {TOKENIZER_DIR}/ with {RECORD} "
        f"(preprocess.build --tokenizer, or an import folder) nor {SPM_MODEL} with {SPM_RECORD} (preprocess.build)",
    )


def _hf(folder: Path, record: dict, symbols: Sequence[str]) -> TextIds:
    tok = load_fast_tokenizer(folder / TOKENIZER_DIR)
    vocab = vocab_from_tokenizer(tok, folder / TOKENIZER_DIR)
    try:
        recorded = fairseq_to_hf_from_record(record)
    except (KeyError, TypeError) as e:
        raise TokenizerError(folder / RECORD, f"an incomplete tokenizer record (no {e})") from None
    if vocab.sha256 != record.get("tokenizer_sha256") or vocab.fairseq_to_hf != recorded:
        raise TokenizerError(folder / TOKENIZER_DIR, f"is not the tokenizer {folder / RECORD} records")
    if list(symbols) != vocab.symbols:
        raise TokenizerError(folder / "dict.txt", "does not list the tokenizer's vocabulary in its id order")
    to_fairseq = vocab.hf_to_fairseq
    backend = tok.backend_tokenizer
    backend.no_truncation()  # cut after mapping, keeping </s>
    backend.no_padding()

    def bodies(texts: List[str]) -> List[List[int]]:
        return [[to_fairseq[i] for i in enc.ids] for enc in backend.encode_batch(texts, add_special_tokens=False)]

    return TextIds(bodies, f"the tokenizer in {folder / TOKENIZER_DIR}")


def _sentencepiece(folder: Path, symbols: Sequence[str]) -> TextIds:
    import sentencepiece as spm

    record_path, model_path = folder / SPM_RECORD, folder / SPM_MODEL
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        normalization = record["normalization"]
        lowercase, nfkc = bool(normalization["lowercase"]), bool(normalization["nfkc"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise TokenizerError(record_path, f"no readable normalisation record ({type(e).__name__}: {e})") from None
    try:
        sp = spm.SentencePieceProcessor(model_file=str(model_path))
    except (OSError, RuntimeError) as e:
        raise TokenizerError(model_path, f"not a sentencepiece model ({e})") from None
    pieces = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]  # the XLM-R id rule (preprocess/vocab.py)
    if list(symbols) != [*FAIRSEQ_SPECIALS[:4], *pieces, FAIRSEQ_SPECIALS[4]]:
        raise TokenizerError(folder / "dict.txt", f"does not list the pieces of {model_path} in their id order")
    index = {s: i for i, s in enumerate(symbols)}

    def bodies(texts: List[str]) -> List[List[int]]:
        lines = [normalize_line(t, lowercase=lowercase, nfkc=nfkc) for t in texts]
        return [[index.get(p, UNK) for p in ps] for ps in sp.encode(lines, out_type=str)]

    return TextIds(bodies, f"{model_path} after the normalisation {record_path} records")
