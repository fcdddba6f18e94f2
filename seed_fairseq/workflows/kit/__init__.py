"""What two or more workflows use (the comparison, the adaptation and its study, gpucheck), and none
of them alone: the objective table and its ``fairseq-train`` arguments (``objectives``, ``argv``), the
run plan's shared fields and the stages every workflow has (``pipeline``), the ``--out`` folder and
its stage records (``folder``), the corpus and a retrieval set derived from it (``corpus``), the
held-out validation set (``heldout``), the checks before anything runs (``checks``), the command
itself (``command``), interrupts and process groups (``interrupt``), the tools a stage starts
(``tools``), fairseq-train's logs (``logs``), statistics (``stats``) and the export round trip
(``roundtrip``).  Imports without fairseq; never imports a workflow.
"""
