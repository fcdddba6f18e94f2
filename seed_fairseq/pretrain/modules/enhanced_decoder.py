"""RetroMAE's enhanced decoder: one transformer layer with two input streams and a
per-row attention mask (DupMAE paper, §3.1, Eq. 2-5).

    H1 (query)   = [h + p_0, h + p_1, ..., h + p_N]         h: the encoder's [CLS] vector
    H2 (content) = [h, e_x1 + p_1, ..., e_xN + p_N]         e_x: embeddings of the ORIGINAL tokens
    A = softmax(Q K^T / sqrt(d) + M) V,   Q = H1 W_Q, K = H2 W_K, V = H2 W_V

The layer is BERT's (post-LN): ``LN(H1 + Dropout(A W_O))`` (the residual is the
query stream, as in the paper and the reference code), then the feed-forward
block with its own residual and LayerNorm.  Row ``i`` of the mask ``M`` hides
the keys the data pipeline drew for that row (``data/decoder_mask_dataset.py``)
and always its own position, so the prediction at position ``i`` is made from
``h``, the position ``p_i`` and other tokens only: it never sees ``x_i``.

The mask arrives as a boolean ``(batch, T, T)`` tensor (True = hidden).  Hidden
scores are REPLACED (``masked_fill``, not added) by the most negative finite
float32 and the softmax runs in float32: a visible key then takes all the
weight (the hidden ones get exactly 0, so no gradient reaches them), and a
fully hidden row -- every padding row -- gives a uniform average instead of
NaN, whatever the model's dtype (bfloat16/float16 included).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout

HIDDEN_FILL = torch.finfo(torch.float32).min


class EnhancedDecoderLayer(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ffn_embed_dim: int,
        activation_fn: str = "gelu",
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
    ):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"decoder attention heads ({num_heads}) must divide the hidden size ({embed_dim})")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.attn_layer_norm = LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_embed_dim)
        self.fc2 = nn.Linear(ffn_embed_dim, embed_dim)
        self.final_layer_norm = LayerNorm(embed_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.dropout = FairseqDropout(dropout, module_name=type(self).__name__)
        self.attention_dropout = FairseqDropout(attention_dropout, module_name=type(self).__name__)
        self.activation_dropout = FairseqDropout(activation_dropout, module_name=type(self).__name__)

    def _heads(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # B x H x T x hd

    def forward(self, query: torch.Tensor, content: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``query``/``content`` (batch, T, dim), ``hidden`` (batch, T, T) bool -> (batch, T, dim)."""
        b, t, c = query.shape
        if content.shape != query.shape or hidden.shape != (b, t, t):
            raise ValueError(
                f"query {tuple(query.shape)}, content {tuple(content.shape)} and mask {tuple(hidden.shape)} "
                "must be (batch, T, dim), (batch, T, dim), (batch, T, T)"
            )
        q = self._heads(self.q_proj(query) * self.scaling)
        k = self._heads(self.k_proj(content))
        v = self._heads(self.v_proj(content))
        scores = torch.matmul(q, k.transpose(-1, -2)).float()
        scores = scores.masked_fill(hidden.unsqueeze(1), HIDDEN_FILL)
        probs = self.attention_dropout(F.softmax(scores, dim=-1).type_as(v))
        attn = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, c)
        x = self.attn_layer_norm(query + self.dropout(self.out_proj(attn)))
        y = self.fc2(self.activation_dropout(self.activation_fn(self.fc1(x))))
        return self.final_layer_norm(x + self.dropout(y))
