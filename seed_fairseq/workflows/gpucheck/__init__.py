"""One-command verification of a CUDA machine (``scripts/gpu_check.sh``, docs/gpu.md).

A workflow over the plugin, ``preprocess``, ``hf``, ``retrieval`` and the workflows' ``kit`` and
``measure``; nothing imports it.
``cli.py`` reads the command line and runs ``session.py``'s stages (``inputs.py``: the --data
folder); ``profile.py`` holds every difference between a GPU run and the dry run (device,
precisions, shape, backend); ``search.py`` finds the largest batch;
``runs.py`` trains in this process through fairseq's ``Trainer`` (``training.py``: what a run
measured, words/s after warm-up) and ``kernels.py`` profiles a few of its updates under
``torch.profiler``; ``checks.py`` runs the real ``fairseq-train``, the export, encoding and faiss;
``report.py`` writes the report.
Importing it imports no fairseq (the stages import it when they run).
"""
