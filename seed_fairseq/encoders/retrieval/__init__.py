"""Dense retrieval with exported encoders (the ``[retrieval]`` extra); imports without fairseq.

Library modules (the command-line drivers are ``examples/retrieval/*.py``; the BEIR / MS MARCO
loaders are ``seed_fairseq.base.retrieval_data``):

* ``search``    encoding with sentence-transformers, faiss indexes and top-k
* ``metrics``   ir_measures metrics, TREC run files, paired permutation test
* ``bm25``      the bm25s baseline
* ``representations`` the registry of retrieval representations (``cls`` built in; DupMAE's in
  ``seed_fairseq/encoders/dupmae/``, found through the ``seed_fairseq.representations`` entry points)
* ``negatives`` hard negatives from BM25 (DPR) or the model's own top-k (ANCE)
* ``config``    ``FinetuneConfig`` and the fine-tuning flags generated from its fields
* ``batching``  training queries, hard negatives per example, batches without a text twice
* ``curve``     the dev curve during fine-tuning (``--eval-every``)
* ``training``  dual-encoder fine-tuning (``finetune``, ``finetune_to_folder``)
* ``evaluate``  search + metrics of one model on one split
* ``analysis``  [CLS] cosine of random pairs by length (SEED-Encoder, Figures 1b/5)
* ``cli``       what the drivers share: argparse types, search options, the one-line ``error:``
"""
