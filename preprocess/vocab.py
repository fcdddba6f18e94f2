"""Sentencepiece BPE training, the fairseq dict.txt, and the id mapping between them.

Id mapping (XLM-R convention, what HuggingFace's XLMRobertaTokenizer does with
fairseq_offset=1):

    sentencepiece            fairseq Dictionary
    0  <unk>            ->   3  <unk>
    1  <s>              ->   0  <s>
    2  </s>             ->   2  </s>
    (no pad piece)           1  <pad>
    k >= 3              ->   k + 1
    (added at load time)     len(spm) + 1  <mask>   (by the training task)

dict.txt lists the pieces with sentencepiece ids 3..N-1 in id order, one
``PIECE 1`` per line: the count is always 1 so dict.txt is a pure function of
spm.model (anyone can rebuild it from the model alone), and fairseq never
reorders a loaded dictionary by count.
"""

import io
import re
from typing import Iterable

import sentencepiece as spm

from .errors import PreprocessError

SPM_UNK, SPM_BOS, SPM_EOS = 0, 1, 2
FAIRSEQ_BOS, FAIRSEQ_PAD, FAIRSEQ_EOS, FAIRSEQ_UNK = 0, 1, 2, 3
_SPECIAL_SPM_TO_FAIRSEQ = {SPM_UNK: FAIRSEQ_UNK, SPM_BOS: FAIRSEQ_BOS, SPM_EOS: FAIRSEQ_EOS}
_SPECIAL_FAIRSEQ_TO_SPM = {v: k for k, v in _SPECIAL_SPM_TO_FAIRSEQ.items()}
# Symbols fairseq's Dictionary (and the training task's <mask>) own; a learned
# piece spelled the same way would collide with them.
_RESERVED = {"<s>", "<pad>", "</s>", "<unk>", "<mask>"}
_WHITESPACE = re.compile(r"\s")


def spm_to_fairseq_id(spm_id: int) -> int:
    """sentencepiece id -> fairseq Dictionary index (see module docstring)."""
    if spm_id < 0:
        raise ValueError(f"negative sentencepiece id {spm_id}")
    return _SPECIAL_SPM_TO_FAIRSEQ.get(spm_id, spm_id + 1)


def fairseq_to_spm_id(fairseq_id: int) -> int:
    """Inverse of spm_to_fairseq_id; <pad> (1) has no sentencepiece id."""
    if fairseq_id == FAIRSEQ_PAD:
        raise ValueError("fairseq <pad> (1) has no sentencepiece id")
    if fairseq_id < 0:
        raise ValueError(f"negative fairseq id {fairseq_id}")
    return _SPECIAL_FAIRSEQ_TO_SPM.get(fairseq_id, fairseq_id - 1)


def systematic_sample(paths: Iterable, total_lines: int, sample_size: int, out_path) -> int:
    """Write a deterministic, evenly spread sample of the non-blank lines of ``paths``.

    Line i (counting non-blank lines only) is kept when floor(i*S/L) steps,
    which keeps exactly min(S, L) lines spread over the whole corpus, streams
    (no line is held in memory) and needs no random generator.
    """
    keep_all = sample_size <= 0 or sample_size >= total_lines
    kept = 0
    i = 0
    with open(out_path, "w", encoding="utf-8", newline="\n") as out:
        for path in paths:
            with open(path, encoding="utf-8", newline="\n") as f:
                for line in f:
                    if line == "\n":
                        continue
                    if keep_all or (i * sample_size) // total_lines != ((i + 1) * sample_size) // total_lines:
                        out.write(line)
                        kept += 1
                    i += 1
    return kept


def train_spm(
    sample_path,
    vocab_size: int,
    threads: int,
    byte_fallback: bool = True,
    character_coverage: float = 0.9995,
) -> bytes:
    """Train the BPE model on the sample; returns the serialized model bytes.

    ``sentence_iterator``/``model_writer`` keep file paths out of the model's
    stored trainer spec, so two builds of the same data give identical bytes
    wherever they run. The normalizer is ``identity``: text was normalised
    by preprocess.text already, and spm must not change it again (decoding
    then gives back the normalised text exactly).
    """
    writer = io.BytesIO()

    def lines():
        with open(sample_path, encoding="utf-8", newline="\n") as f:
            for line in f:
                yield line.rstrip("\n")

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines(),
            model_writer=writer,
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            normalization_rule_name="identity",
            # Default special ids, stated so the convention is visible here.
            unk_id=SPM_UNK,
            bos_id=SPM_BOS,
            eos_id=SPM_EOS,
            pad_id=-1,
            num_threads=max(1, threads),
            # The sample is already the size we want; spm must not subsample it.
            input_sentence_size=0,
            shuffle_input_sentence=False,
            # Wikipedia paragraphs are often longer than the 4192-byte default,
            # which spm would silently skip.
            max_sentence_length=1 << 16,
            minloglevel=2,
        )
    except RuntimeError as e:
        msg = str(e)
        m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
        if m:
            raise PreprocessError(
                sample_path,
                f"--vocab-size {m.group(1)} is larger than this data supports "
                f"(at most {m.group(2)}); lower --vocab-size or add data",
            ) from None
        m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m:
            raise PreprocessError(
                sample_path,
                f"--vocab-size {m.group(1)} is too small: the data needs at least {m.group(2)} "
                "pieces for its characters and byte fallback",
            ) from None
        raise PreprocessError(sample_path, f"sentencepiece training failed: {msg}") from None
    return writer.getvalue()


def load_spm(model_path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(model_path))


def write_spm_vocab(sp: spm.SentencePieceProcessor, path) -> None:
    """spm.vocab as spm_train writes it: ``piece<TAB>score`` in id order (informational)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i in range(sp.get_piece_size()):
            f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n")


def write_fairseq_dict(sp: spm.SentencePieceProcessor, path) -> None:
    """dict.txt for fairseq: pieces 3..N-1 in sentencepiece order, count 1 each."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i in range(3, sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if piece in _RESERVED or _WHITESPACE.search(piece) or not piece:
                # Would break fairseq's Dictionary (duplicate symbol, or a line
                # its whitespace tokenizer splits); cannot happen with text from
                # preprocess.text, so this is a guard, not a policy.
                raise PreprocessError(path, f"sentencepiece piece {i} {piece!r} cannot go into a fairseq dict")
            f.write(f"{piece} 1\n")
