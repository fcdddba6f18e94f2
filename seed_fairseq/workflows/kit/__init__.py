"""What the workflows share: the objective table and its ``fairseq-train`` arguments
(``objectives``), the plan and the folders of ``--out`` (``layout``), the checks before
anything runs (``checks``), the held-out set (``heldout``), interrupts and process groups
(``interrupt``), the tools a stage starts (``tools``), the command-line pieces (``command``),
fairseq-train's logs (``logs``), statistics (``stats``) and the export round trip
(``roundtrip``).  Imports without fairseq; never imports a workflow.
"""
