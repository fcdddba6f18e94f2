"""Encoded pieces -> fairseq mmap .bin/.idx with fairseq's own binarizer.

This is the code path ``fairseq-preprocess --only-source --srcdict dict.txt
--dataset-impl mmap --workers N`` runs (FileBinarizer + VocabularyDatasetBinarizer),
called in-process to skip its CLI start-up; tests check the bytes are identical.
"""

from fairseq.binarizer import FileBinarizer, VocabularyDatasetBinarizer
from fairseq.data import Dictionary

from .errors import PreprocessError


def binarize_file(encoded_path, dict_path, output_prefix, workers):
    """Write ``output_prefix``.bin/.idx; returns (sequences, tokens)."""
    dictionary = Dictionary.load(str(dict_path))
    binarizer = VocabularyDatasetBinarizer(dictionary, append_eos=True)
    summary = FileBinarizer.multiprocess_dataset(
        str(encoded_path),
        "mmap",
        binarizer,
        str(output_prefix),
        vocab_size=len(dictionary),
        num_workers=max(1, workers),
    )
    if summary.num_replaced:
        # Every piece comes from the same spm model as dict.txt, so an <unk>
        # replacement means the two disagree: refuse to write a silent mismatch.
        raise PreprocessError(
            encoded_path,
            f"{summary.num_replaced} pieces are not in {dict_path} "
            f"(e.g. {list(summary.replaced)[:5]}); dict.txt and spm.model do not match",
        )
    return summary.num_seq, summary.num_tok
