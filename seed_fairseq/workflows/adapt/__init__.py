"""Domain adaptation in one command: a HuggingFace encoder continued on the user's corpus, with the evidence.

    python examples/adapt.py --model HF_DIR --corpus TEXT --objective seed --out OUT

imports the model, builds the data with its own tokenizer, continues its pre-training
with the objective (the heads the model lacks trained alone first), keeps the checkpoint that
retrieves best on a held-out set, exports it to HuggingFace and writes a before/after
report of retrieval (docs/adapt.md).  Imports without fairseq: the stages that need
it load it when they run.  Built on what the workflows share (``seed_fairseq.workflows.kit``:
the objective table, the shared stages, the held-out validation, the tools a stage starts, the
interrupt handling), the stage runner of ``preprocess.stages`` and the retrieval and HF encoders.  Modules:

* ``plan``      the resolved plan, its defaults (with their reasons) and the folders of ``--out``
* ``training``  fairseq-train's arguments, and which checkpoint becomes the adapted model
* ``pipeline``  the resumable stages (``preprocess.stages.Runner``) in one ``--out`` folder
* ``progress``  progress lines of a running fairseq-train, read from its log
* ``report``    report.md, report.json and report.png
* ``cli``       the command line
* ``study``     the study: every objective x arm x seed from one model on one domain (``examples/adaptation_study.py``)
* ``study_report``  its table, verdicts and plot
"""
