"""Dense retrieval with exported encoders (the ``[retrieval]`` extra).

Library modules (the command-line drivers are ``examples/retrieval/*.py``):

* ``data``      BEIR / MS MARCO loaders (``FILE:LINE`` errors), the derived set of the demo
* ``search``    encoding with sentence-transformers, faiss indexes and top-k
* ``metrics``   ir_measures metrics, TREC run files, paired permutation test
* ``bm25``      the bm25s baseline
* ``negatives`` hard negatives from BM25 (DPR) or the model's own top-k (ANCE)
* ``training``  dual-encoder fine-tuning (``FinetuneConfig``, ``finetune``, ``finetune_to_folder``)
* ``evaluate``  search + metrics of one model on one split
* ``analysis``  [CLS] cosine of random pairs by length (SEED-Encoder, Figures 1b/5)
* ``cli``       what the drivers share: argparse types, search options, the one-line ``error:``
"""
