"""Measuring a pre-training update: FLOPs (``flops``), the tensor-memory peak (``memory``) and
whether the data pipeline feeds a GPU (``feed``).  Used by the workflows and ``benchmarks/``;
imports without fairseq; never imports a workflow.
"""
