"""Is the bottleneck learning anything?  Pre-training diagnostics computed at every validation.

Built on what every objective declares, so each objective of the plugin gets them.  "The
vector" below is the model's own (``models/bottleneck.py``): the [CLS] vector by default,
the ``--bottleneck-pooling`` one otherwise; the logged names keep "cls" (``cls_cosine``,
``<term>_cls_bits``: other tools and the docs read them) whatever the pooling.

* **bits through the bottleneck** (per term in ``criterion.bottleneck_terms``):
  the term's loss with each sequence's own bottleneck vector minus its loss with
  those vectors rotated across the batch (sequence i gets the vector of sequence
  i+1; a forward hook on ``model.bottleneck``, the module every bottleneck term
  reads the encoder through, rotates its output).  Logged
  as ``<term>_cls_bits`` (bits per unit of the term, like ``<term>_loss``) and
  ``<term>_cls_bits_seq`` (bits per sequence).  Near 0: the decoder side does
  not use the vector (bypassed or unused bottleneck); > 0: what it takes from it.
* **anisotropy** ``cls_cosine``: the mean cosine between the pooled vectors
  (of the UNMASKED blocks) of every pair of blocks in a validation batch.  Near
  1: all blocks get nearly the same vector (collapse).
* **retrieval probe** (``--retrieval-probe-size N``, off by default): the first N
  validation blocks, each cut in two halves; the first half is the query, the
  second its one positive among the N second halves; ``probe_mrr10`` = MRR@10 of
  the model's representation (``model.sentence_embedding``: pooled, unit vectors with
  ``--retrieval-similarity cosine``) by inner product (no labels needed; a tie ranks the
  positive below the others), ``probe_candidates`` = N (chance is about 2.9/N).
* **the starting model's scores** (``start_logs``, ``log_vs_start``): the task scores
  the probe and ``--retrieval-dev`` (``retrieval_dev.py``) once before the first update
  and carries those numbers in every validation's logging output, so that each logs
  ``<score>_vs_start``, the score now minus the start's.

Everything runs under ``torch.no_grad()`` in eval mode on the validation subset
only, draws no random numbers (the permutation is a fixed rotation), and
computes dot products and cosines in fp32, so it works on CPU and in half
precision and leaves the training trajectory unchanged.
"""

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq import metrics

LN2 = math.log(2)
PREFIX = "diag_"
START = PREFIX + "start_"  # the starting model's scores, carried to every validation (start_logs)


def rotate_bottleneck(model) -> torch.utils.hooks.RemovableHandle:
    """Context-free hook handle: the bottleneck vectors (``model.bottleneck``'s output, B x C)
    rotated by one across the batch."""

    def hook(module, inputs, output):
        return output.roll(1, dims=0) if output.size(0) >= 2 else output

    return model.bottleneck.register_forward_hook(hook)


def unmasked_tokens(sample, pad: int) -> torch.Tensor:
    """The encoder input with the MLM targets put back: the blocks as they are."""
    src, target = sample["net_input"]["src_tokens"], sample["target"]
    return torch.where(target.ne(pad), target, src)


def sentence_vectors(model, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 ``(batch, dim)``: the model's representation of ``tokens`` (``model.sentence_embedding``:
    pooled, L2-normalised when its similarity is cosine, so that the inner product scores it)."""
    features, _ = model.encode(tokens)
    return model.sentence_embedding(features, tokens).float()


def pairwise_cosine_sum(cls: torch.Tensor) -> Tuple[float, int]:
    """(sum of the cosines of all pairs i < j, number of pairs)."""
    n = cls.size(0)
    if n < 2:
        return 0.0, 0
    unit = torch.nn.functional.normalize(cls.float(), dim=-1)
    sims = unit @ unit.t()
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=sims.device), diagonal=1)
    return float(sims[upper].sum()), int(upper.sum())


def bottleneck_logs(criterion, model, sample, own_losses: Dict[str, float]) -> Dict[str, float]:
    """Per bottleneck term: its loss sum with the bottleneck vectors rotated across the batch minus with its own."""
    terms = [t for t in getattr(criterion, "bottleneck_terms", ()) if t in own_losses]
    bsz = sample["net_input"]["src_tokens"].size(0)
    if not terms or bsz < 2:
        return {}
    counts = criterion.task.term_counts(sample)
    handle = rotate_bottleneck(model)
    try:
        shuffled = criterion.compute_terms(model, sample)
    finally:
        handle.remove()
    logs = {}
    for t in terms:
        if t in shuffled:
            logs[f"{PREFIX}{t}_cls_sum"] = float(shuffled[t].loss) - float(own_losses[t])
            logs[f"{PREFIX}{t}_cls_units"] = int(counts[t])
            logs[f"{PREFIX}{t}_cls_seqs"] = bsz
    return logs


def validation_logs(criterion, model, sample, logging_output: dict) -> Dict[str, float]:
    """The per-batch diagnostics (summed over batches and workers by fairseq)."""
    pad = criterion.padding_idx
    with torch.no_grad():
        own = {
            k[: -len("_loss_sum")]: v
            for k, v in logging_output.items()
            if k.endswith("_loss_sum") and torch.is_tensor(v)
        }
        logs = bottleneck_logs(criterion, model, sample, own)
        cos_sum, pairs = pairwise_cosine_sum(sentence_vectors(model, unmasked_tokens(sample, pad)))
        logs[PREFIX + "cos_sum"] = cos_sum
        logs[PREFIX + "cos_pairs"] = pairs
    return logs


def halves(block: torch.Tensor, bos: int, eos: int, pad: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(query, passage): [CLS] + first half, [CLS] + second half of a block's tokens."""
    body = block[1:] if int(block[0]) == bos else block
    body = body[body.ne(pad)]
    if body.numel() and int(body[-1]) == eos:
        body = body[:-1]
    h = body.numel() // 2
    head = torch.tensor([bos], dtype=block.dtype)
    return torch.cat([head, body[:h]]), torch.cat([head, body[h:]])


def encode_sentences(model, seqs: Sequence[torch.Tensor], pad: int, batch_size: int = 32) -> torch.Tensor:
    """fp32 representations (``sentence_vectors``) of token sequences of any lengths (right-padded per batch)."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i : i + batch_size]
        width = max(s.numel() for s in chunk)
        tokens = torch.full((len(chunk), width), pad, dtype=torch.long)
        for j, s in enumerate(chunk):
            tokens[j, : s.numel()] = s
        out.append(sentence_vectors(model, tokens.to(device)))
    return torch.cat(out)


def probe_pairs(blocks, size: int, bos: int, eos: int, pad: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(query, passage) halves of the first ``size`` blocks long enough to be cut in two
    (fewer when the split has fewer: the task refuses that before training)."""
    pairs: List = []
    for i in range(len(blocks)):
        if len(pairs) >= size:
            break
        q, p = halves(blocks[i], bos, eos, pad)
        if q.numel() >= 3 and p.numel() >= 3:  # [CLS] + at least two tokens each
            pairs.append((q, p))
    return pairs


PROBE_KEYS = (PREFIX + "probe_rr_sum", PREFIX + "probe_queries", PREFIX + "probe_runs")


def retrieval_probe(
    model, blocks, size: int, bos: int, eos: int, pad: int, batch_size: int = 32
) -> Optional[Dict[str, float]]:
    """MRR@10 of first halves retrieving their own second halves among ``size`` blocks
    (``PROBE_KEYS``; None with fewer than two pairs)."""
    pairs = probe_pairs(blocks, size, bos, eos, pad)
    if len(pairs) < 2:
        return None
    with torch.no_grad():
        queries = encode_sentences(model, [q for q, _ in pairs], pad, batch_size)
        passages = encode_sentences(model, [p for _, p in pairs], pad, batch_size)
        scores = queries @ passages.t()
        positive = scores.diagonal().unsqueeze(1)
        # ties count against the positive: a collapsed encoder (all scores equal) ranks last, not first
        rank = (scores >= positive).sum(dim=1)
        rr = torch.where(rank <= 10, 1.0 / rank.float(), torch.zeros_like(rank, dtype=torch.float))
    return {PREFIX + "probe_rr_sum": float(rr.sum()), PREFIX + "probe_queries": len(pairs), PREFIX + "probe_runs": 1}


def start_logs(start: Dict[str, float], names: Sequence[str]) -> Dict[str, float]:
    """The logging output that carries the start scores (``<name>_vs_start``): the same keys
    on every worker (fairseq sums the outputs key by key), zero where a score is unknown."""
    out: Dict[str, float] = {}
    for name in names:
        out[START + name] = float(start.get(name, 0.0))
        out[START + name + "_runs"] = int(name in start)
    return out


def start_line(scores: Dict[str, float], note: str = "") -> str:
    """The one line of the starting model's scores (``examples/plot_diagnostics.py`` reads it
    back as the run's point at update 0)."""
    values = " | ".join(f"{name} {value:.4f}" for name, value in scores.items())
    return f"retrieval at update 0 (the starting model{', ' + note if note else ''}): {values}"


def log_vs_start(current: Dict[str, float], total: Callable[[str], float]) -> None:
    """``<name>_vs_start`` = the score now minus the starting model's, for each known start."""
    for name, value in current.items():
        runs = total(START + name + "_runs")
        if runs > 0:
            metrics.log_scalar(f"{name}_vs_start", value - total(START + name) / runs, runs, round=4)


def totals(logging_outputs: Sequence[Dict[str, Any]]) -> Callable[[str], float]:
    """``key -> the sum of the key over the logging outputs`` (0 when absent)."""
    return lambda key: sum(float(log.get(key, 0)) for log in logging_outputs)


def reduce(logging_outputs: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    """Log the diagnostics of the batches of a validation (no-op for training logs); the
    retrieval scores logged, ``{"probe_mrr10": ...}`` (for ``log_vs_start``)."""
    total = totals(logging_outputs)
    keys = {k for log in logging_outputs for k in log if k.startswith(PREFIX)}
    if not keys:
        return {}
    for key in sorted(k for k in keys if k.endswith("_cls_sum")):
        term = key[len(PREFIX) : -len("_cls_sum")]
        units, seqs = total(f"{PREFIX}{term}_cls_units"), total(f"{PREFIX}{term}_cls_seqs")
        if units > 0:
            metrics.log_scalar(f"{term}_cls_bits", total(key) / units / LN2, units, round=6)
            metrics.log_scalar(f"{term}_cls_bits_seq", total(key) / seqs / LN2, seqs, round=4)
    pairs = total(PREFIX + "cos_pairs")
    if pairs > 0:
        metrics.log_scalar("cls_cosine", total(PREFIX + "cos_sum") / pairs, pairs, round=4)
    probe = probe_score(total)
    if not probe:
        return {}
    runs, queries = total(PREFIX + "probe_runs"), total(PREFIX + "probe_queries")
    metrics.log_scalar("probe_mrr10", probe["probe_mrr10"], queries, round=4)
    metrics.log_scalar("probe_candidates", queries / runs, runs, round=1)
    return probe


def probe_score(total: Callable[[str], float]) -> Dict[str, float]:
    """``{"probe_mrr10": ...}`` from the probe's sums (empty when the probe did not run)."""
    runs, queries = total(PREFIX + "probe_runs"), total(PREFIX + "probe_queries")
    return {"probe_mrr10": total(PREFIX + "probe_rr_sum") / queries} if runs > 0 and queries > 0 else {}
