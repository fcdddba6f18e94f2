"""DupMAE's retrieval representation in one place (Xiao & Liu, "RetroMAE v2", Eq. 10-12).

* ``pooling``    the token-wise max-pool of vocabulary logits (pure torch; pre-training's
                 bag-of-words decoder uses it too)
* ``head``       the head files of an export folder and the sentence-transformers module
* ``retriever``  loading, encoding, the exact hybrid search; registers the ``dupmae``
                 representation with ``seed_fairseq.encoders.retrieval.representations``
* ``export``     the head built from a DupMAE checkpoint; registers the ``dupmae`` exporter
                 with ``seed_fairseq.encoders.hf.representation``

Both registrations are found through the entry points of setup.py, so neither
``retrieval`` nor ``hf`` imports this package.  Nothing here imports fairseq at
import time.
"""
