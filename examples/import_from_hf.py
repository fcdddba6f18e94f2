#!/usr/bin/env python
"""Import a local HuggingFace BERT, RoBERTa or XLM-R encoder for continued pre-training.

    python examples/import_from_hf.py --model HF_DIR --out DIR [--force]

writes DIR/checkpoint.pt (the plugin's encoder), DIR/dict.txt (the model's own
ids), DIR/tokenizer/ (its tokenizer) and DIR/model_args.txt (its sizes, and its
representation: --bottleneck-pooling and --retrieval-similarity of its
sentence-transformers modules, so that pre-training trains the vector the model is
used by); then

    python -m preprocess.build --text corpus.txt --tokenizer DIR/tokenizer --out data-bin
    fairseq-train data-bin --user-dir seed_fairseq --task seed_pretrain --criterion seed_pretrain \\
        --arch seed_encoder_base $(cat DIR/model_args.txt) \\
        --finetune-from-model DIR/checkpoint.pt ...

continues pre-training it with any objective (decoder/heads freshly initialised; a rerun
resumes from the run's own checkpoint_last.pt; docs/hf.md).  Nothing is
written unless fairseq's outputs equal the HF model's (features, and MLM
logits when the model has an MLM head) to --atol, both in float32: a model
stored in fp16 or bf16 is imported as float32 (the record's source_dtype says
what it was stored in).  A sentence-transformers folder's pooling (cls, mean,
max, mean_sqrt_len_tokens, lasttoken), Normalize module and similarity_fn_name are
recorded (else cosine for a model that normalises, else dot; a plain HuggingFace
folder gets the papers' [CLS] + dot), and its SentenceTransformer vectors are
compared with fairseq's too.  A folder without a usable tokenizer, whose config.json
contradicts its weights, or with a module the plugin cannot reproduce (Dense,
weightedmean pooling, ...) is refused with one error line.
"""

import argparse
import logging
import sys

from seed_fairseq.encoders.hf.import_ import HFImportError, import_model


def main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="local HuggingFace model folder (config.json, weights, tokenizer)")
    p.add_argument("--out", required=True, help="output folder (missing, empty, or an earlier import)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier import in --out (a folder holding seed_fairseq_import.json); "
        "any other non-empty folder is refused, with or without --force",
    )
    p.add_argument("--atol", type=float, default=1e-5, help="max abs difference allowed vs HF (fp32)")
    p.add_argument("--seed", type=int, default=1, help="seed of a freshly initialised MLM head")
    args = p.parse_args(argv)
    try:
        import_model(args.model, args.out, force=args.force, atol=args.atol, seed=args.seed)
    except HFImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, also in the middle of writing the checkpoint (checkpoint_files.torch_save)
        print("interrupted; rerun the same command to import", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
