"""Analyses of a trained encoder beyond retrieval metrics."""

from pathlib import Path
from typing import Dict, List, Sequence, Tuple


def cls_similarity(
    model_dir: Path, texts: Sequence[str], lengths: Sequence[int], pairs: int, seed: int
) -> Tuple[Dict[int, float], List[str], int]:
    """Mean cosine of [CLS] vectors of random pairs of token windows of each length
    (SEED-Encoder, Figures 1b/5: a collapsed, anisotropic [CLS] space has cosines near 1).

    Returns ({length: mean cosine}, notes on skipped lengths, the model's usable length).

    Windows are cut from the token stream of ``texts`` (documents concatenated),
    so a window spans sentence and paragraph boundaries like pre-training
    blocks do; each input is [CLS] + L-2 tokens + </s>.
    """
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    max_len = model.config.max_position_embeddings - (
        tok.pad_token_id + 1 if model.config.model_type in ("xlm-roberta", "roberta") else 0
    )
    stream = [i for t in texts for i in tok(t, add_special_tokens=False)["input_ids"]]
    rng = np.random.default_rng(seed)
    out, notes = {}, []
    for L in lengths:
        if L > max_len:
            notes.append(f"{L}: skipped, above the model's {max_len} positions")
            continue
        if L - 2 > len(stream):
            notes.append(f"{L}: skipped, corpus has only {len(stream)} tokens")
            continue
        starts = rng.integers(0, len(stream) - (L - 2) + 1, size=(pairs, 2))
        ids = torch.tensor([[tok.cls_token_id, *stream[s : s + L - 2], tok.sep_token_id] for s in starts.ravel()])
        vecs = []
        with torch.inference_mode():
            for chunk in ids.split(32):
                vecs.append(model(input_ids=chunk, attention_mask=torch.ones_like(chunk)).last_hidden_state[:, 0])
        v = torch.nn.functional.normalize(torch.cat(vecs).float(), dim=-1).view(pairs, 2, -1)
        out[L] = float((v[:, 0] * v[:, 1]).sum(-1).mean())
    return out, notes, max_len
