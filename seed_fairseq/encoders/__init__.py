"""What is done with a pre-trained encoder: HuggingFace import and export (``hf``), dense
retrieval (``retrieval``), DupMAE's representation (``dupmae``) and head dropping (``drop_heads``).

Imports ``base``, ``pretrain``, the package face (``import seed_fairseq`` registers the plugin)
and ``preprocess``.
"""
