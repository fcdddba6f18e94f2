"""Time of the weak decoder at 512 vs 128 tokens: does the attention window cost O(n^2)?

    python benchmarks/decoder_window.py [--tokens 4096] [--repeat 3] [--threads 2] [--json OUT]

SEED's weak decoder at base width (3 layers x 768, FFN 3072, 12 heads, [CLS] memory) runs
forward + backward on the same number of tokens per batch (``--tokens``) as batches of 128
and of 512 tokens, with the paper's window (k=2) computed banded (the default: only the
``1 + k`` allowed scores per query, ``modules/windowed_decoder.py``), the same window as
fairseq's masked attention (``k2-masked``: all ``n x n`` scores computed, then masked; the
reference the tests compare with), and ordinary causal attention (``full``: what fairseq's
decoder computes). Per-token time at 512 / at 128 is printed for each (1.0 = linear in the
length), and the time of the banded window against the masked one at 512 tokens. Median
over ``--repeat`` runs (the first of each shape is a warm-up), process CPU time and wall clock.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def build_decoder(window, dim=768, layers=3, heads=12, ffn=3072, vocab=1000, positions=512):
    import argparse as ap

    import torch
    from fairseq.data import Dictionary
    from fairseq.models.transformer import transformer_legacy

    from seed_fairseq.pretrain.modules.windowed_decoder import WindowedTransformerDecoder

    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    args = ap.Namespace(
        encoder_embed_dim=dim,
        decoder_embed_dim=dim,
        decoder_ffn_embed_dim=ffn,
        decoder_layers=layers,
        decoder_attention_heads=heads,
        decoder_normalize_before=True,
        layernorm_embedding=True,
        decoder_learned_pos=True,
        no_scale_embedding=True,
        share_decoder_input_output_embed=True,
        max_target_positions=positions,
        activation_fn="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.0,
    )
    transformer_legacy.base_architecture(args)
    embed = torch.nn.Embedding(len(dictionary), dim, dictionary.pad())
    return WindowedTransformerDecoder(args, dictionary, embed, window).train()


def time_shape(decoder, batch, length, repeat, dim=768):
    import torch

    from seed_fairseq.pretrain.models.bottleneck import vector_memory

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, decoder.embed_tokens.num_embeddings, (batch, length), generator=g)
    features = torch.randn(batch, length, dim, generator=g, requires_grad=True)
    wall, cpu = [], []
    for i in range(repeat + 1):
        decoder.zero_grad()
        t, c = time.perf_counter(), time.process_time()
        x, _ = decoder(tokens, encoder_out=vector_memory(features[:, 0]), features_only=True)
        x.float().pow(2).mean().backward()
        if i:  # the first is a warm-up
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per batch at both lengths (default 4096)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = {}
    for name, window, banded in (("2", 2, True), ("2-masked", 2, False), ("full", "full", True)):
        decoder = build_decoder(window)
        decoder.banded = banded
        row = {}
        for length in (128, 512):
            wall, cpu = time_shape(decoder, args.tokens // length, length, args.repeat)
            row[length] = {"wall_s": wall, "cpu_s": cpu}
        row["ratio_512_128"] = row[512]["cpu_s"] / row[128]["cpu_s"]
        results[name] = row
    results["banded_vs_masked_512"] = results["2"][512]["cpu_s"] / results["2-masked"][512]["cpu_s"]
    print(f"\nweak decoder 3 x 768, forward + backward, {args.tokens} tokens per batch, {args.threads} threads")
    print(f"{'window':<10}{'CPU s @128':>12}{'CPU s @512':>12}{'512/128':>9}")
    for name in ("2", "2-masked", "full"):
        row = results[name]
        print(f"{name:<10}{row[128]['cpu_s']:>12.3f}{row[512]['cpu_s']:>12.3f}{row['ratio_512_128']:>9.2f}")
    k2, full = results["2"]["ratio_512_128"], results["full"]["ratio_512_128"]
    print(f"window k=2 vs fairseq's causal attention: {k2 / full:.2f}x its growth from 128 to 512 tokens")
    print(f"window k=2 banded / masked at 512 tokens: {results['banded_vs_masked_512']:.2f}x the CPU time")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
