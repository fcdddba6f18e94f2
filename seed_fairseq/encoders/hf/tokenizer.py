"""A HuggingFace fast tokenizer that gives exactly fairseq's token ids.

Pre-training text went through ``preprocess.text.normalize_line`` (NFKC,
lower-casing, NFKC, control characters dropped, whitespace collapsed), then
the sentencepiece BPE model (identity normaliser), then the XLM-R id rule
(fairseq id = spm id + 1; <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> last).

transformers' own spm conversion assumes XLM-R's unigram model, so the
tokenizer is assembled from the ``tokenizers`` library's parts: the same
normalisation steps, sentencepiece's whitespace handling (Metaspace), a BPE
model over the fairseq-ordered vocabulary with merges derived from the
sentencepiece scores (transformers' ``generate_merges``), byte fallback, and
RoBERTa's ``<s> A </s>`` template.  The export then checks ids against
fairseq on real strings before anything is written.
"""

import functools
import sys
from typing import TYPE_CHECKING, Dict, List, Optional

import sentencepiece as spm

if TYPE_CHECKING:
    from tokenizers.normalizers import Normalizer
    from transformers import PreTrainedTokenizerFast

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
MASK = "<mask>"


@functools.lru_cache(maxsize=None)
def _char_class(predicate):
    """A regex character class of every code point satisfying ``predicate``.

    Python's ``\\s`` and ``str.isspace`` differ from Oniguruma's ``\\s`` (e.g.
    U+001C..U+001F), so the classes are spelled out from Python's own rules.
    Cached: it walks every code point (half a second), and every export builds a tokenizer.
    """
    ranges, start, prev = [], None, None
    for cp in range(sys.maxunicode + 1):
        if predicate(chr(cp)):
            if start is None:
                start = cp
            prev = cp
        elif start is not None:
            ranges.append((start, prev))
            start = None
    if start is not None:
        ranges.append((start, prev))
    parts = [f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges]
    return "[" + "".join(parts) + "]"


def normalizer_for(record: dict) -> "Normalizer":
    """tokenizers normaliser equal to preprocess.text.normalize_line under ``record``."""
    from tokenizers import Regex, normalizers

    from ...base.vocabulary.text import CONTROL_CHARACTERS

    steps = []
    if record.get("nfkc", True):
        steps.append(normalizers.NFKC())
    if record.get("lowercase", True):
        steps.append(normalizers.Lowercase())
        if record.get("nfkc", True):
            steps.append(normalizers.NFKC())
    steps.append(normalizers.Replace(Regex(CONTROL_CHARACTERS.pattern), ""))  # \xHH: same syntax
    steps.append(normalizers.Replace(Regex(_char_class(str.isspace) + "+"), " "))
    steps.append(normalizers.Strip())
    return normalizers.Sequence(steps)


def fairseq_vocab(sp: spm.SentencePieceProcessor) -> Dict[str, int]:
    """Piece -> fairseq id, in the XLM-R convention, with <mask> last."""
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for spm_id in range(3, sp.get_piece_size()):
        vocab[sp.id_to_piece(spm_id)] = spm_id + 1
    vocab[MASK] = sp.get_piece_size() + 1
    return vocab


def build_tokenizer(spm_model, record: dict, model_max_length: int) -> "PreTrainedTokenizerFast":
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import generate_merges

    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    vocab = fairseq_vocab(sp)
    learned = {sp.id_to_piece(i): sp.get_score(i) for i in range(3, sp.get_piece_size()) if not sp.is_byte(i)}
    merges = generate_merges(vocab, vocab_scores=learned, skip_tokens=SPECIALS + [MASK])
    byte_fallback = any(sp.is_byte(i) for i in range(sp.get_piece_size()))

    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=byte_fallback)
    )
    tok.normalizer = normalizer_for(record)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    # The generic fast class: transformers' XLMRobertaTokenizer rebuilds a
    # unigram model from the vocabulary, which is not what was trained here.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token=MASK,
        model_max_length=model_max_length,
    )


def fairseq_encode(
    text: str, sp: spm.SentencePieceProcessor, dictionary, record: dict, max_length: Optional[int] = None
) -> List[int]:
    """Reference ids: what pre-training did to raw text (normalise, spm, dict, [CLS]...</s>)."""
    from preprocess.text import normalize_line

    line = normalize_line(text, lowercase=record.get("lowercase", True), nfkc=record.get("nfkc", True))
    pieces = sp.encode(line, out_type=str) if line else []
    ids = [dictionary.bos()] + [dictionary.index(p) for p in pieces] + [dictionary.eos()]
    if max_length is not None and len(ids) > max_length:
        ids = ids[: max_length - 1] + [dictionary.eos()]
    return ids
