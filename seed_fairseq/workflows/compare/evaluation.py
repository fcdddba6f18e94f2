"""One pre-trained model's evaluation: [CLS] cosine by length, zero-shot and few-shot runs.

Writes into ``OUT/eval/O/sS/`` (each file atomically, so a killed stage resumes
with the runs it finished):

    cls_similarity.json        mean [CLS] cosine of random text pairs per length (Figures 1b/5)
    REP.zeroshot.trec          the exported model as it is, before any fine-tuning
    REP.ftP.trec / .json       after fine-tuning on P% of the training queries (Figure 6c/d);
                               the .json is finetune()'s summary and the seconds it took

REP is ``own`` (the model's own vector as its export declares it: [CLS] and dot product from
scratch, the --init model's pooling and similarity, which it was pre-trained on, with --init)
or ``dupmae`` (DupMAE's dense + sparse representation, Eq. 12).  Every model is fine-tuned by the same
``FinetuneConfig`` (seed = the pre-training seed, so every objective of a seed
sees the same few-shot subset of queries); fine-tuned weights are not kept.
"""

import random
import time
from dataclasses import replace
from pathlib import Path
from typing import List

import torch

from ...base.fileio import write_json_atomic
from ...base.retrieval_data import load_data
from ...encoders.retrieval.analysis import cls_similarity
from ...encoders.retrieval.evaluate import evaluate_model
from ...encoders.retrieval.metrics import write_trec_run
from ...encoders.retrieval.search import load_model
from ...encoders.retrieval.training import finetune
from ..kit.corpus import corpus_documents
from ..kit.objectives import OBJECTIVES
from .plan import fraction_label, log
from .report import METRICS

SIMILARITY_CHARS = 1_000_000  # text the [CLS]-cosine windows are cut from


def similarity_texts(comp) -> List[str]:
    """Up to ~1 MB of corpus documents (a seeded choice), the same for every model."""
    cached = getattr(comp, "_similarity_texts", None)
    if cached is not None:
        return cached
    docs = [" ".join(d) for d in corpus_documents(comp.plan.corpus)]
    random.Random(1).shuffle(docs)
    texts, size = [], 0
    for d in docs:
        if size >= SIMILARITY_CHARS:
            break
        texts.append(d)
        size += len(d)
    comp._similarity_texts = texts
    return texts


def evaluate_run(comp, obj: str, seed: int) -> None:
    p = comp.plan
    torch.set_num_threads(p.threads)
    folder: Path = comp.eval_dir(obj, seed)
    hf = comp.hf_dir(obj, seed)
    train = load_data(comp.retrieval_dir, p.train_split)
    test = load_data(comp.retrieval_dir, p.test_split)
    search = dict(k=p.k, batch_size=p.finetune.encode_batch_size, index=p.finetune.index, show_progress=False,
                  names=METRICS)  # fmt: skip

    sim_file = folder / "cls_similarity.json"
    if not sim_file.exists():
        t0 = time.time()
        cos, notes, max_len = cls_similarity(hf, similarity_texts(comp), p.cos_lengths, p.cos_pairs, seed)
        write_json_atomic(
            sim_file,
            {"cosine": {str(k): v for k, v in cos.items()}, "notes": notes, "max_positions": max_len,
             "seconds": time.time() - t0},
        )  # fmt: skip

    for rep in OBJECTIVES[obj].representations:
        zero_shot = folder / f"{rep}.zeroshot.trec"
        if not zero_shot.exists():
            model = load_model(str(hf), p.device, p.max_seq_length, representation=rep)
            _, run = evaluate_model(model, test, **search)
            write_trec_run(run, zero_shot, tag=f"{obj}-{rep}-zeroshot")
        for f in p.fractions:
            name = f"{rep}.ft{fraction_label(f)}"
            if (folder / f"{name}.trec").exists():
                continue
            t0 = time.time()
            log(f"fine-tuning {obj} ({rep}, seed {seed}) on {fraction_label(f)}% of the training queries")
            model = load_model(str(hf), p.device, p.max_seq_length, representation=rep)
            summary = finetune(model, train, replace(p.finetune, train_fraction=f, seed=seed))
            _, run = evaluate_model(model, test, **search)
            write_json_atomic(folder / f"{name}.json", {**summary, "seconds": time.time() - t0})
            write_trec_run(run, folder / f"{name}.trec", tag=f"{obj}-{rep}-ft{fraction_label(f)}")
