"""The floor: what every other part of the project stands on, importable without fairseq.

Errors, the objective descriptions, extension points, the registration hook, file safety
(``fileio``), token ids (``vocabulary``) and the retrieval sets (``retrieval_data``).  Imports
nothing else of the project; fairseq only inside the functions that use it.
"""
