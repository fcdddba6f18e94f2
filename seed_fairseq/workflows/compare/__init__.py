"""Every bottleneck objective of the plugin compared on identical data, encoder and budget.

Imports without fairseq: the stages that need it (fairseq-train, the FLOPs count, the
import and export) load it when they run.

The command is ``examples/compare_objectives.py`` (``examples/reproduce_small.py``
is the same command under its old name).  Modules:

* ``objectives``  the objective table -> ``fairseq-train`` arguments over one encoder
* ``presets``     the quick and standard presets
* ``layout``      the resolved plan, the folders of ``--out`` and the helpers every room shares
* ``pipeline``    the resumable stages (``preprocess.stages.Runner``) in one ``--out`` folder
* ``flops``       FLOPs of a pre-training update, counted on real batches
* ``evaluation``  one model's [CLS] cosine, zero-shot and few-shot fine-tuned runs
* ``stats``       mean ± std over seeds, the paired permutation test on seed-averaged queries
* ``logs``        the validation rows (diagnostics) of fairseq-train's JSON log
* ``plots``       the PNG figures
* ``report``      results.json and results.md
* ``cli``         the command line
"""
