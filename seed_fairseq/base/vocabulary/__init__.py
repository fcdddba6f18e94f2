"""The lowest layer: what a token id means, importable without fairseq.

* ``dictionary``: the identity of a fairseq ``dict.txt`` (``dictionary_sha256``).
* ``tokenizer``: a HuggingFace tokenizer's vocabulary as a fairseq dictionary,
  the ids between them, the checks that a tokenizer fits a model.
* ``text``: the characters every tool drops from text.

Nothing here imports fairseq at import time (``dictionary_sha256`` reads
``dict.txt`` with fairseq's own ``Dictionary`` when called).
"""
