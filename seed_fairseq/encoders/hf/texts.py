"""How raw text becomes ids for the export: the data folder's sentencepiece model (``SpmTexts``)
or the HuggingFace tokenizer of an import / ``--tokenizer`` build (``HFTexts``), and the texts
every export is checked on."""

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Union

from ...base.vocabulary.tokenizer import TOKENIZER_DIR, load_fast_tokenizer
from .tokenizer import build_tokenizer, fairseq_encode

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Edge cases every export is checked on, besides real text from the data.
CHECK_STRINGS = [
    "Café au lait in Zürich costs 4.50 CHF — naïve prices!",
    "UPPER CASE and MiXeD CaSe",
    "digits 0123456789 and 3.14159, 1e-6",
    "unicode: ﬁ ℌ İstanbul 北京 Ωμέγα 🙂 \u2028 tabs\tand  spaces",
    "",
]


class SpmTexts:
    """Data folders of ``preprocess.build`` with sentencepiece: the export builds a fast
    tokenizer reproducing normalisation + spm + the XLM-R id rule (fairseq ids = HF ids)."""

    def __init__(self, data, dictionary, sp, record):
        self.data, self.dictionary, self.sp, self.record = Path(data), dictionary, sp, record
        self.fairseq_to_hf = None  # the identity
        self.pad = dictionary.pad()
        self.bos, self.eos = dictionary.bos(), dictionary.eos()

    def reference_ids(self, text: str, max_len: int) -> List[int]:
        return fairseq_encode(text, self.sp, self.dictionary, self.record, max_length=max_len)

    def decode(self, fairseq_ids) -> Optional[str]:
        from preprocess.vocab import fairseq_to_spm_id

        ids = [fairseq_to_spm_id(int(t)) for t in fairseq_ids if int(t) > 3]
        return self.sp.decode(ids) if ids else None

    def tokenizer(self, max_len: int) -> "PreTrainedTokenizerFast":
        return build_tokenizer(self.data / "spm.model", self.record, max_len)

    def describe(self) -> str:
        return ", ".join(self.record.get("steps", []))


class HFTexts:
    """Data (or import) folders whose ids come from a HuggingFace tokenizer (``--tokenizer``,
    ``examples/import_from_hf.py``): the export writes that same tokenizer and puts the
    embedding rows back into its id order (``vocabulary/tokenizer.py``)."""

    def __init__(self, data, tok, vocab):
        self.data, self.tok, self.vocab = Path(data), tok, vocab
        self.fairseq_to_hf = vocab.fairseq_to_hf
        self.hf_to_fairseq = vocab.hf_to_fairseq
        self.pad, self.bos, self.eos = (vocab.fairseq_to_hf[i] for i in (1, 0, 2))
        self.record = {}

    def reference_ids(self, text: str, max_len: int) -> List[int]:
        return self.tok(text, truncation=True, max_length=max_len)["input_ids"]

    def decode(self, fairseq_ids) -> Optional[str]:
        ids = [self.fairseq_to_hf[int(t)] for t in fairseq_ids if int(t) > 3]
        return self.tok.decode(ids, skip_special_tokens=True) if ids else None

    def tokenizer(self, max_len: int) -> "PreTrainedTokenizerFast":
        tok = load_fast_tokenizer(self.data / TOKENIZER_DIR)
        tok.model_max_length = max_len
        return tok

    def describe(self) -> str:
        return f"the model's own tokenizer ({type(self.tok).__name__})"


def check_texts(texts_source: Union[SpmTexts, HFTexts], data, n: int = 24) -> List[str]:
    """Real text: the first lines of the data's valid split, decoded, plus edge cases."""
    from fairseq.data import data_utils

    texts = list(CHECK_STRINGS)
    valid = data_utils.load_indexed_dataset(str(Path(data) / "valid"), None)
    if valid is not None:
        for i in range(min(n, len(valid))):
            text = texts_source.decode(valid[i])
            if text:
                texts.append(text)
    # longer than the model: exercises truncation
    texts.append(" ".join(texts) * 8)
    return texts


CHECK_BATCH = 8  # texts per forward of an export's numeric check


def length_batches(tokenizer, texts: List[str], max_len: int, size: int = CHECK_BATCH) -> List[List[str]]:
    """``texts`` in batches of ``size`` of similar token length (each still padded within itself): the
    check's one text longer than the model would otherwise pad every other to ``max_len`` (a base model's
    export check on the CPU: ~5x the work)."""
    lengths = [len(tokenizer(t, truncation=True, max_length=max_len)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    return [[texts[i] for i in order[k : k + size]] for k in range(0, len(order), size)]
