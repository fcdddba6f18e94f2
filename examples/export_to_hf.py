#!/usr/bin/env python
"""Export a seed_pretrain checkpoint to a HuggingFace transformers folder.

    python examples/export_to_hf.py --checkpoint checkpoints/checkpoint_best.pt \
        --data data-bin --out seed-encoder-hf [--mlm-head] [--force] [--trust-checkpoint]

``--data`` is the folder written by ``python -m preprocess.build`` (dict.txt,
spm.model, preprocess.json) or by ``examples/import_from_hf.py``; without it, the
checkpoint's own folder when it holds dict.txt (an import folder exports as is:
``--checkpoint IMPORT/checkpoint.pt`` alone).  The output loads offline with
``AutoModel``/``AutoTokenizer``/``SentenceTransformer`` and was checked equal to
fairseq (token ids, and outputs to --atol) before it was written.  Its
sentence-transformers modules are the model's own representation as the checkpoint records
it (the pooling, ``Normalize`` and ``similarity_fn_name`` of --bottleneck-pooling /
--retrieval-similarity: an import of a mean-pooling, normalising model is exported as one; a
model pre-trained from scratch, as the papers', with [CLS] pooling and dot product), checked
against fairseq's pooled vectors too.  A DupMAE checkpoint also gets DupMAE's retrieval
representation (``--representation``, ``seed_fairseq/encoders/dupmae/``).
"""

import argparse
import logging
import sys
from pathlib import Path

from seed_fairseq.encoders.hf import representation
from seed_fairseq.encoders.hf.export import ExportError, export


def main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="seed_pretrain checkpoint or encoder-only checkpoint")
    p.add_argument(
        "--data",
        default=None,
        help="folder with dict.txt and spm.model + preprocess.json (preprocess.build) or tokenizer/ (an import). "
        "Default: the checkpoint's folder if it holds dict.txt (an import folder)",
    )
    p.add_argument("--out", required=True, help="output folder (missing, empty, or an earlier export)")
    p.add_argument("--mlm-head", action="store_true", help="export XLMRobertaForMaskedLM with the MLM head")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier export in --out (a folder holding seed_fairseq_export.json); "
        "any other non-empty folder is refused, with or without --force",
    )
    p.add_argument("--atol", type=float, default=1e-5, help="max abs difference allowed vs fairseq (fp32)")
    p.add_argument(
        "--representation",
        choices=representation.names(),  # own, cls, dupmae
        default=None,
        help="own: sentence-transformers modules of the model's own representation as the checkpoint records it "
        "(its --bottleneck-pooling, Normalize and similarity_fn_name for --retrieval-similarity cosine); cls: "
        "[CLS] pooling and dot product whatever it records; dupmae: own's folder plus DupMAE's representation "
        "(dupmae.json + dupmae_head.safetensors: the [CLS] projection and the MLM head as vocabulary "
        "projection). Default: dupmae for a dupmae_pretrain checkpoint (without --mlm-head), else own",
    )
    p.add_argument(
        "--dupmae-dim",
        type=int,
        default=None,
        help="DupMAE: dimension d' of the projected [CLS] (default 384, or the hidden size if smaller; "
        "d' = d is the identity)",
    )
    p.add_argument(
        "--dupmae-top-k",
        type=int,
        default=None,
        help="DupMAE: vocabulary entries kept per text (default 384, or the selectable vocabulary if smaller)",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load --checkpoint with Python's full unpickler, which runs any code pickled in it: only for a file "
        "you trust.  Without it a checkpoint holding anything but the types fairseq checkpoints hold is refused",
    )
    args = p.parse_args(argv)
    data = args.data
    if data is None:
        if not Path(args.checkpoint).is_file():
            p.error(f"--checkpoint {args.checkpoint}: not found")
        data = Path(args.checkpoint).parent
        if not (data / "dict.txt").is_file():
            p.error(f"--data is needed: {data} has no dict.txt (give the folder written by python -m preprocess.build)")
        print(f"note: --data {data} (the checkpoint's folder)", file=sys.stderr)
    try:
        export(
            args.checkpoint,
            data,
            args.out,
            force=args.force,
            with_lm_head=args.mlm_head,
            atol=args.atol,
            representation=args.representation,
            dupmae_dim=args.dupmae_dim,
            dupmae_top_k=args.dupmae_top_k,
            trust_checkpoint=args.trust_checkpoint,
        )
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
