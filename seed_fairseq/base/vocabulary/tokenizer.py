"""A HuggingFace tokenizer's vocabulary as a fairseq dictionary, and the ids between them.

fairseq's ``Dictionary`` always puts ``<s> <pad> </s> <unk>`` at ids 0..3 and
the masked-LM task appends ``<mask>`` last, so a model's own vocabulary maps
onto it by one fixed permutation:

    fairseq id                HF id
    0 <s>                     the tokenizer's [CLS] (<s> for RoBERTa/XLM-R)
    1 <pad>                   [PAD]
    2 </s>                    [SEP] (</s>)
    3 <unk>                   [UNK]
    4 .. N-2                  every other HF id, in increasing order
    N-1 <mask>                [MASK]

``dict.txt`` lists the tokens of fairseq ids 4..N-2 (count 1 each): the model's
own id order with the five specials taken out.  For RoBERTa and XLM-R the
permutation is the identity; for BERT ([PAD]=0, [UNK]=100, [CLS]=101, ...) it
is not, so the import permutes the embedding rows and the export permutes them
back.  The blocks fairseq builds are then ``[CLS] x1 .. xn [SEP]`` in the
model's own terms.

The record of this mapping (``hf_tokenizer.json`` beside ``dict.txt``) also
says how the vocabulary marks words, for ``--mask-whole-words``: WordPiece
marks continuations (``##``), byte-level BPE (``Ġ``) and sentencepiece
(``▁``) mark word starts.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from .dictionary import is_ordinary

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

RECORD = "hf_tokenizer.json"
RECORD_FORMAT = "seed_fairseq.hf_tokenizer/1"
TOKENIZER_DIR = "tokenizer"
# fairseq id -> the tokenizer attribute naming the HF token it stands for
SPECIAL_ROLES = (("bos", "cls_token"), ("pad", "pad_token"), ("eos", "sep_token"), ("unk", "unk_token"))
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")

# how a vocabulary marks words: (kind, marker)
WORDPIECE = ("continuation_prefix", "##")
BYTE_BPE = ("start_prefix", "\u0120")  # Ġ: GPT-2's byte for a space
SENTENCEPIECE = ("start_prefix", "\u2581")  # ▁


class TokenizerError(ValueError):
    """A tokenizer that cannot be used as asked; ``str()`` is ``PATH: problem``."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def tokenizer_folder(path) -> Path:
    """Where the tokenizer of ``path`` is: the folder itself, or its ``tokenizer/`` when
    ``path`` is a data or import folder of this project (it holds :data:`RECORD`)."""
    path = Path(path)
    if (path / RECORD).is_file() and (path / TOKENIZER_DIR).is_dir():
        return path / TOKENIZER_DIR
    return path


def broken_json(folder) -> Optional[TokenizerError]:
    """The error naming the first ``*.json`` of ``folder`` that is not JSON, or a
    tokenizer file (``*token*.json``) that is not a JSON object; None if all are fine.

    For the message only, once loading failed: transformers reports either as a
    ``JSONDecodeError`` or an ``AttributeError`` without the file's name.
    """
    for path in sorted(Path(folder).glob("*.json")):
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            return TokenizerError(path, f"not JSON ({e})")
        if "token" in path.name and not isinstance(value, dict):
            return TokenizerError(path, f"not a JSON object but a {type(value).__name__}")
    return None


def load_fast_tokenizer(path) -> "PreTrainedTokenizerFast":
    """The folder's own tokenizer through ``AutoTokenizer`` (fast only), offline."""
    path = Path(path)
    if not path.is_dir():
        raise TokenizerError(path, "not a folder holding a HuggingFace tokenizer")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many kinds for a folder it cannot read
        raise broken_json(path) or TokenizerError(
            path, f"no loadable HuggingFace tokenizer ({type(e).__name__}: {e})"
        ) from None
    if not getattr(tok, "is_fast", False):
        raise TokenizerError(path, f"{type(tok).__name__} is not a fast (Rust) tokenizer; a tokenizer.json is needed")
    check_usable(tok, path)
    return tok


# Spare embedding rows a model may have beyond its tokenizer: matrices are padded for
# fast matmuls (fairseq and Megatron to a multiple of 8; T5 has 28 spare rows over
# 32,100 tokens, DeBERTa-v3 99 over 128,001, Phi-2 905 over 50,295), so up to 7
# rows, or fewer than 1/32 of the tokenizer's size.  transformers builds a 5-token
# tokenizer for a folder without its tokenizer files: 5 tokens for 400 rows is
# refused by this rule, not taken for padding.
SPARE_ROWS, SPARE_FRACTION = 7, 32
# a sentence any usable tokenizer has a known token for (digits are in every vocabulary)
PROBE = "the 1 2 3 and 2024"


def check_usable(tok, path) -> None:
    """Refuse a tokenizer with no ordinary token, or one that maps a plain sentence to
    unknown tokens only: what transformers builds for a folder whose tokenizer files are
    missing (its 5 special tokens), which would turn every text into ``<unk>``."""
    ordinary = len(tok) - len(set(tok.all_special_ids))
    if ordinary < 1:
        raise TokenizerError(
            path,
            f"no usable tokenizer: it has only its {len(tok)} special tokens (tokenizer files missing or "
            "incomplete: transformers builds such a tokenizer for a folder without them)",
        )
    unk = getattr(tok, "unk_token_id", None)
    ids = tok(PROBE, add_special_tokens=False)["input_ids"]
    if unk is not None and ids and all(i == unk for i in ids):
        raise TokenizerError(path, f"no usable tokenizer: it encodes {PROBE!r} to unknown tokens only")


def check_tokenizer_fits(tok, rows: int, path) -> None:
    """Refuse a tokenizer that cannot be the model's own: an id it can produce beyond the
    word embedding's ``rows`` (an index error, or another row's vector), far fewer
    tokens than rows (missing tokenizer files: transformers then builds a near-empty
    tokenizer and every word becomes ``<unk>``), or one :func:`check_usable` refuses.
    :class:`TokenizerError` naming ``path``."""
    vocab = tok.get_vocab()
    n = len(tok)
    top = max(vocab.values(), default=-1)
    if top >= rows:
        raise TokenizerError(
            path,
            f"the tokenizer has token ids up to {top} but the model's word embedding has {rows} rows: "
            "not this model's tokenizer",
        )
    check_usable(tok, path)
    if rows - n > max(SPARE_ROWS, n // SPARE_FRACTION):
        raise TokenizerError(
            path,
            f"no usable tokenizer: it has {n} tokens for the model's {rows} word-embedding rows "
            "(tokenizer files missing, incomplete or another model's)",
        )


def word_boundary(tok) -> tuple:
    """(kind, marker) of the tokenizer's subword convention, read from its model and pre-tokenizer."""
    spec = json.loads(tok.backend_tokenizer.to_str())
    model = spec.get("model") or {}

    def components(node):
        if not isinstance(node, dict):
            return []
        return [node.get("type")] + [t for sub in node.get("pretokenizers") or [] for t in components(sub)]

    pre = components(spec.get("pre_tokenizer"))
    if model.get("type") == "WordPiece":
        return (WORDPIECE[0], model.get("continuing_subword_prefix") or "##")
    if "ByteLevel" in pre:
        return BYTE_BPE
    if "Metaspace" in pre:
        return SENTENCEPIECE
    raise TokenizerError(
        getattr(tok, "name_or_path", "tokenizer"),
        f"cannot tell how its {model.get('type')} vocabulary marks words (pre-tokenizers {pre}); "
        "supported: WordPiece (BERT), byte-level BPE (RoBERTa), sentencepiece Metaspace (XLM-R)",
    )


def starts_word(symbol: str, boundary: Sequence[str]) -> bool:
    kind, marker = boundary
    if kind == WORDPIECE[0]:
        return not symbol.startswith(marker)
    return symbol.startswith(marker)


def tokenizer_sha256(tok) -> str:
    """Content identity of a tokenizer: its whole pipeline (normaliser, model with the
    vocabulary, pre-/post-processing) in canonical JSON, plus its special tokens."""
    spec = json.loads(tok.backend_tokenizer.to_str())
    # call-time settings transformers switches on and off around each call, not the tokenizer
    spec.pop("truncation", None)
    spec.pop("padding", None)
    specials = {name: getattr(tok, name, None) for _, name in SPECIAL_ROLES + (("mask", "mask_token"),)}
    data = json.dumps({"tokenizer": spec, "specials": specials}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


@dataclass
class TokenizerVocab:
    """The mapping between a tokenizer's ids and a fairseq dictionary's."""

    fairseq_to_hf: List[int]  # fairseq id -> HF id (a permutation of range(N))
    symbols: List[str]  # fairseq id -> HF token string
    boundary: tuple
    special_tokens: Dict[str, str]  # fairseq role -> HF token
    sha256: str

    @property
    def hf_to_fairseq(self) -> List[int]:
        inverse = [0] * len(self.fairseq_to_hf)
        for f, h in enumerate(self.fairseq_to_hf):
            inverse[h] = f
        return inverse

    @property
    def is_identity(self) -> bool:
        return all(f == h for f, h in enumerate(self.fairseq_to_hf))

    def dict_lines(self) -> List[str]:
        """dict.txt: the tokens of fairseq ids 4..N-2 (fairseq adds the specials, the task <mask>)."""
        return [f"{s} 1\n" for s in self.symbols[4:-1]]

    def record(self) -> dict:
        return {
            "format": RECORD_FORMAT,
            "tokenizer": TOKENIZER_DIR,
            "tokenizer_sha256": self.sha256,
            "vocab_size": len(self.fairseq_to_hf),
            "special_tokens": self.special_tokens,
            "special_hf_ids": dict(
                {role: self.fairseq_to_hf[i] for i, role in enumerate(("bos", "pad", "eos", "unk"))},
                mask=self.fairseq_to_hf[-1],
            ),
            "word_boundary": {"kind": self.boundary[0], "marker": self.boundary[1]},
            "identity_ids": self.is_identity,
            "rule": "fairseq 0..3 = the tokenizer's cls/pad/sep/unk, N-1 = its mask, 4..N-2 = every other "
            "HF id in increasing order (seed_fairseq.base.vocabulary.tokenizer)",
        }


def vocab_from_tokenizer(tok, path="tokenizer", expected_size: Optional[int] = None) -> TokenizerVocab:
    """The fairseq mapping of ``tok``; raises :class:`TokenizerError` when it has none."""
    vocab = tok.get_vocab()  # token -> id, added tokens included
    n = len(vocab)
    if sorted(vocab.values()) != list(range(n)):
        raise TokenizerError(path, f"its {n} token ids are not 0..{n - 1} without gaps")
    if expected_size is not None and n != expected_size:
        raise TokenizerError(
            path,
            f"the tokenizer has {n} tokens but the model's embedding has {expected_size} rows; "
            "they must be the same vocabulary",
        )
    by_id = [None] * n
    for token, i in vocab.items():
        by_id[i] = token
    roles = SPECIAL_ROLES + (("mask", "mask_token"),)
    special_ids, special_tokens = {}, {}
    for role, attr in roles:
        token = getattr(tok, attr, None)
        if token is None or str(token) not in vocab:
            raise TokenizerError(path, f"the tokenizer has no {attr} (needed as fairseq's {role})")
        special_ids[role] = vocab[str(token)]
        special_tokens[role] = str(token)
    if len(set(special_ids.values())) != len(special_ids):
        raise TokenizerError(path, f"its special tokens are not distinct: {special_tokens}")
    taken = set(special_ids.values())
    order = [special_ids[r] for r in ("bos", "pad", "eos", "unk")]
    order += [i for i in range(n) if i not in taken] + [special_ids["mask"]]
    symbols = list(FAIRSEQ_SPECIALS[:4]) + [by_id[i] for i in order[4:-1]] + ["<mask>"]
    for f in range(4, n - 1):
        s = symbols[f]
        if s in FAIRSEQ_SPECIALS or not s or any(c.isspace() for c in s):
            raise TokenizerError(
                path,
                f"token {s!r} (id {order[f]}) cannot be a fairseq dictionary symbol "
                "(empty, holds whitespace, or is one of fairseq's own specials)",
            )
    return TokenizerVocab(order, symbols, word_boundary(tok), special_tokens, tokenizer_sha256(tok))


def write_dict(vocab: TokenizerVocab, path) -> None:
    from ..fileio import write_text_atomic

    write_text_atomic(path, "".join(vocab.dict_lines()))


def load_record(folder) -> Optional[dict]:
    """``hf_tokenizer.json`` of a data (or import) folder, or None when the folder is a
    sentencepiece build."""
    p = Path(folder) / RECORD
    if not p.is_file():
        return None
    rec = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise TokenizerError(p, "not a seed_fairseq tokenizer record")
    return rec


def fairseq_to_hf_from_record(rec: dict) -> List[int]:
    """The permutation a record describes (the same rule as :func:`vocab_from_tokenizer`)."""
    n = rec["vocab_size"]
    ids = rec["special_hf_ids"]
    taken = {ids[r] for r in ("bos", "pad", "eos", "unk", "mask")}
    return [ids[r] for r in ("bos", "pad", "eos", "unk")] + [i for i in range(n) if i not in taken] + [ids["mask"]]


def word_start_table(symbols: Sequence[str], rec: dict, nspecial: int, mask_idx: int) -> List[bool]:
    """Per fairseq symbol: does it start a word (specials and <mask> stand alone)."""
    boundary = (rec["word_boundary"]["kind"], rec["word_boundary"]["marker"])
    return [not is_ordinary(i, nspecial, mask_idx) or starts_word(s, boundary) for i, s in enumerate(symbols)]
