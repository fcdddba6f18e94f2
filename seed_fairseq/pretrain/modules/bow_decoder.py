"""CPDAE's decoder: an MLP from the encoder's [CLS] vector (the bottleneck vector:
``--bottleneck-pooling``) to one logit per vocabulary entry.

    Linear(d, d) -> GELU -> LayerNorm -> Linear(d, |V|)      (Xu et al., CIKM 2022, Sec. 3.1.2)

The paper's "two layers of feed-forward network with GELU and LayerNorm"; in
shape it is RoBERTa's LM head, but the output projection is NOT tied to the
token embeddings and has its own bias: the decoder is a separate, deliberately
shallow reader of the bottleneck, and nothing of it survives pre-training.
Being non-autoregressive, it has no token input that could bypass [CLS].
"""

import torch
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from torch import nn


class BowMLPDecoder(nn.Module):
    def __init__(self, embed_dim: int, vocab_size: int):
        super().__init__()
        self.dense = nn.Linear(embed_dim, embed_dim)
        self.activation = nn.GELU()  # the exact erf GELU, as in BERT
        self.layer_norm = LayerNorm(embed_dim)
        self.out_proj = nn.Linear(embed_dim, vocab_size, bias=True)
        self.apply(init_bert_params)  # N(0, 0.02) weights, zero biases, like the encoder

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        """(batch, dim) [CLS] vectors -> (batch, |V|) logits (one sigmoid each)."""
        return self.out_proj(self.layer_norm(self.activation(self.dense(cls))))
