"""An import checked against its source: the fairseq model's MLM logits and representation against the
HuggingFace model's on the same texts (the largest absolute difference)."""

from pathlib import Path
from typing import Optional, Tuple

import torch


def compare(fs_model, hf_model, hf_mlm, tok, vocab, texts, max_len) -> float:
    """Max abs difference of features (and MLM logits) between fairseq and HF on ``texts``."""
    batch = tok(texts, truncation=True, max_length=max_len, padding=True, return_tensors="pt")
    to_fs = torch.as_tensor(vocab.hf_to_fairseq)
    to_hf = torch.as_tensor(vocab.fairseq_to_hf)
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        fs_features, _ = fs_model(to_fs[batch["input_ids"]], features_only=True)
        hf_features = hf_model(**batch).last_hidden_state
        diff = (fs_features - hf_features).abs()[mask].max().item()
        if hf_mlm is not None:
            fs_logits, _ = fs_model(to_fs[batch["input_ids"]])
            hf_logits = hf_mlm(**batch).logits[..., to_hf]  # columns in fairseq id order
            diff = max(diff, (fs_logits - hf_logits).abs()[mask].max().item())
    return diff


def compare_representation(fs_model, hf_dir: Path, tok, vocab, texts, max_len, cut) -> Optional[Tuple[float, int]]:
    """(max abs difference between the vectors fairseq's model scores (``sentence_embedding``: its
    task's pooling and similarity) on ``texts`` cut at ``cut`` tokens and ``SentenceTransformer``'s of
    ``hf_dir`` cut where sentence-transformers itself cuts them (normalised when the similarity is
    cosine), that cut, at most ``max_len``); None for a folder without ``modules.json``.  ``texts``
    should hold one longer than any cut: then a cut read wrong is a difference too."""
    from sentence_transformers import SentenceTransformer

    from .sentence import MODULES

    if not (hf_dir / MODULES).is_file():
        return None
    st = SentenceTransformer(str(hf_dir), device="cpu", local_files_only=True)
    theirs_cut = min(st.max_seq_length or max_len, max_len)  # beyond the positions it could not encode at all
    st.max_seq_length = theirs_cut
    batch = tok(texts, truncation=True, max_length=cut, padding=True, return_tensors="pt")
    tokens = torch.as_tensor(vocab.hf_to_fairseq)[batch["input_ids"]]
    with torch.no_grad():
        features, _ = fs_model(tokens, features_only=True)
        ours = fs_model.sentence_embedding(features, tokens)
        theirs = st.encode(list(texts), convert_to_tensor=True, batch_size=len(texts), show_progress_bar=False)
    if fs_model.similarity == "cosine":
        theirs = torch.nn.functional.normalize(theirs, p=2, dim=-1)
    return (ours - theirs.to(ours.dtype)).abs().max().item(), theirs_cut
