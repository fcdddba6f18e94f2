"""Raw Wikipedia dumps / BookCorpus-style text -> sentencepiece BPE vocab -> fairseq mmap data.

Entry point: ``python -m preprocess.build --help``. See preprocess/README.md.
"""
