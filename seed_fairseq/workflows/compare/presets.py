"""The two presets of the comparison; every value can be overridden by its flag.

quick     all objectives, 1 seed, the embedded demo corpus (166 KB), a 2 x 128
          encoder, 600 updates of 16 blocks: the whole pipeline in <= 30 min on 2
          CPU cores.  It shows the pipeline, not the science: every dense model
          stays near chance.
standard  all objectives, 2 seeds, the Linux kernel and Python documentation
          from Debian's linux-doc-6.1 and python3.11-doc packages
          (examples/data/get_debian_corpus.sh: 13.3 MB of English prose, 56,629
          paragraphs), the same 2 x 128 encoder, 800 updates of 32 blocks (about
          one pass over the corpus), vocabulary 4000: <= 3 h on 2 cores (a real run: 145 min).

Measured times are in docs/comparison.md (the presets table).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEMO_CORPUS = REPO / "examples" / "data" / "demo_corpus.txt"
DEBIAN_CORPUS = REPO / "examples" / "data" / "debian" / "corpus.txt"


def encoder(layers: int, dim: int, ffn: int, heads: int) -> str:
    return (
        f"--encoder-layers {layers} --encoder-embed-dim {dim} --encoder-ffn-embed-dim {ffn} "
        f"--encoder-attention-heads {heads}"
    )


PRESETS = {
    "quick": dict(
        corpus=str(DEMO_CORPUS),
        seeds=1,
        vocab_size=2000,
        valid_docs=4,  # at least: held out until validation has a batch and --probe-size blocks (heldout.py)
        retrieval_docs=0,  # 0: every document of the corpus
        encoder_args=encoder(2, 128, 256, 4),
        tokens_per_sample=128,
        batch_size=16,
        update_freq=1,
        updates=600,
        warmup=60,
        lr=5e-4,
        validate_every=100,
        probe_size=64,
        generator_args=encoder(1, 64, 128, 2),
        generator_updates=400,
        ft_epochs=10,
        ft_batch_size=32,
        ft_lr=1e-4,
        fractions="0.1,0.3,1.0",
        max_seq_length=128,
        cos_lengths="64,128,256,512",
        cos_pairs=200,
    ),
}
# the quick preset's encoder and schedule shape on Debian's text: a wider encoder (4 x 256, 32 blocks of
# 256) costs ~15x the FLOPs and would need ~40 h on 2 cores for 7 objectives x 2 seeds
PRESETS["standard"] = dict(
    PRESETS["quick"],
    corpus=str(DEBIAN_CORPUS),
    seeds=2,
    vocab_size=4000,
    valid_docs=40,
    retrieval_docs=400,
    batch_size=32,
    updates=800,
    warmup=80,
    validate_every=200,
    probe_size=128,
    generator_updates=500,
    ft_epochs=3,
)
