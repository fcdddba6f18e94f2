"""Every bottleneck objective of the plugin compared on identical data, encoder and budget.

Imports without fairseq: the stages that need it (fairseq-train, the FLOPs count, the
import and export) load it when they run.

The command is ``examples/compare_objectives.py`` (``examples/reproduce_small.py``
is the same command under its old name).  Its own modules (the objective table and its
fairseq-train arguments, the shared stages, the held-out set, statistics and logs are the
workflows' ``kit``; the FLOPs count is ``measure.flops``):

* ``presets``     the quick and standard presets
* ``plan``        the resolved plan, its record and the folders of ``--out``
* ``objectives``  the rows it evaluates, its baseline, the settings one update's FLOPs are counted with
* ``checks``      what it refuses before anything runs (positions, the retrieval splits)
* ``pipeline``    the resumable stages (``preprocess.stages.Runner``) in one ``--out`` folder
* ``evaluation``  one model's [CLS] cosine, zero-shot and few-shot fine-tuned runs
* ``plots``       the PNG figures
* ``report``      results.json and results.md
* ``cli``         the command line
"""
