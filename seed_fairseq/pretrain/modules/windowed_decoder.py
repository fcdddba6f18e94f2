"""The weak decoder: a fairseq Transformer decoder whose self-attention only
looks back a few tokens (SEED-Encoder, Lu et al. 2021, Eq. 9).

Attention window
----------------
With window ``k`` a query at position ``i`` may attend to positions
``i-k+1 .. i`` and, always, to position 0 (the [CLS] token of the decoder
input).  The authors' mask for n=6, k=2 (row = query, ``x`` = may attend)::

    0 x.....
    1 xx....
    2 xxx...
    3 x.xx..
    4 x..xx.
    5 x...xx

The same mask is used in every layer, so the receptive field compounds: after
``L`` layers the output at position ``t`` depends on the input tokens
``t - L*(k-1) .. t`` (``k + (L-1)*(k-1)`` tokens) plus position 0, and on the
encoder only through the single [CLS] memory vector.  For the paper's decoder
(L=3, k=2) the prediction of ``x[t+1]`` sees ``x[t-3..t]``, the [CLS] token and
the encoder's [CLS] vector.  ``window="full"`` gives ordinary causal attention.

Banded computation
------------------
fairseq's attention scores every query against every key and masks all but
``k + 1`` of them: an (n x n) score, softmax and dropout tensor per head and
layer, most of it -inf.  ``WindowedSelfAttention`` computes only the ``k + 1``
allowed scores of each query ([CLS] plus the window), so the decoder's
attention memory and time grow linearly with the length; the values are those
of the masked softmax (``tests/test_model.py`` compares both, with gradients,
pads and every dtype the CPU has).  ``banded=False`` on the decoder selects
fairseq's masked attention, the reference.
"""

from typing import Dict, List, Optional, Tuple, Union

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerConfig, TransformerDecoder
from fairseq.modules import MultiheadAttention
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

FULL = "full"

Window = Union[int, str]


def parse_window(value) -> Window:
    """``"full"`` or an int >= 1; anything else is a clear ValueError."""
    if isinstance(value, str):
        if value.strip().lower() == FULL:
            return FULL
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"decoder attention window must be an integer >= 1 or '{FULL}', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"decoder attention window must be an integer >= 1 or '{FULL}', got {value!r} "
            "(k=1 lets each position see only itself and [CLS])"
        )
    return value


def window_allowed(n: int, window: Window, device=None) -> torch.Tensor:
    """Boolean (n, n) matrix: ``[i, j]`` is True when query ``i`` may attend key ``j``."""
    i = torch.arange(n, device=device).unsqueeze(1)
    j = torch.arange(n, device=device).unsqueeze(0)
    allowed = j <= i
    if window != FULL:
        allowed &= (j > i - window) | (j == 0)
    return allowed


def window_attention_mask(n: int, window: Window, device=None) -> torch.Tensor:
    """Additive float mask (0 where allowed, -inf elsewhere) in fairseq's format.

    Every row keeps at least its diagonal and position 0, so softmax never sees
    an all -inf row (no NaN in half precision).
    """
    mask = torch.zeros(n, n, device=device)
    return mask.masked_fill_(~window_allowed(n, window, device), float("-inf"))


def receptive_field(t: int, window: Window, num_layers: int) -> range:
    """Input positions (besides 0) that can influence the output at position ``t``."""
    if window == FULL:
        return range(0, t + 1)
    return range(max(0, t - num_layers * (window - 1)), t + 1)


def banded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    key_padding_mask: Optional[torch.Tensor],
    dropout,
) -> torch.Tensor:
    """Windowed causal attention computed on the allowed keys only.

    ``q, k, v``: (batch, heads, n, head_dim), ``q`` already scaled;
    ``key_padding_mask``: (batch, n), True at pads, or None; ``dropout``: a
    callable applied to the probabilities.  Query ``i`` attends to key 0 and
    keys ``i-window+1 .. i`` (those >= 1: key 0 has its own slot), which is
    exactly ``window_allowed``.  Returns (batch, heads, n, head_dim).

    Slot ``j`` of the window holds key ``i - window + 1 + j``: the keys are
    padded on the left by ``window - 1`` positions and slot ``j`` is the slice
    starting at ``j`` (a view, nothing copied), so memory is O(n * window).
    """
    n = q.size(-2)
    pad = window - 1
    kp = torch.nn.functional.pad(k, (0, 0, pad, 0))
    vp = torch.nn.functional.pad(v, (0, 0, pad, 0))
    scores = [(q * k[..., :1, :]).sum(-1)]  # slot of key 0, i.e. [CLS]
    scores += [(q * kp[..., j : j + n, :]).sum(-1) for j in range(window)]
    scores = torch.stack(scores, dim=-1)  # (batch, heads, n, 1 + window)

    pos = torch.arange(n, device=q.device).unsqueeze(1) - pad + torch.arange(window, device=q.device)
    invalid = torch.cat([torch.zeros(n, 1, dtype=torch.bool, device=q.device), pos < 1], dim=1)
    if key_padding_mask is not None:
        kpm = torch.nn.functional.pad(key_padding_mask.bool(), (pad, 0), value=True)
        win = torch.stack([kpm[:, j : j + n] for j in range(window)], dim=-1)
        invalid = invalid | torch.cat([key_padding_mask[:, :1].bool().unsqueeze(1).expand(-1, n, 1), win], -1)
        invalid = invalid.unsqueeze(1)  # (batch, 1, n, 1 + window)
    scores = scores.masked_fill(invalid, float("-inf"))
    probs = dropout(torch.softmax(scores, dim=-1))

    out = probs[..., :1] * v[..., :1, :]
    for j in range(window):
        out = out + probs[..., j + 1 : j + 2] * vp[..., j : j + n, :]
    return out


class WindowedSelfAttention(MultiheadAttention):
    """fairseq's MultiheadAttention (same parameters, same checkpoint keys) that
    computes a restricted window with ``banded_attention``.

    Only plain self-attention is banded (the decoder's own call: no
    incremental state, no returned weights, no extra keys); anything else, a
    full window or ``banded = False`` is fairseq's masked computation.
    """

    window: Window = FULL
    banded: bool = True

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=True,
        static_kv=False,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if (
            not self.banded
            or self.window == FULL
            or incremental_state is not None
            or need_weights
            or need_head_weights
            or before_softmax
            or static_kv
            or key is not query
            or value is not query
            or self.bias_k is not None
            or self.add_zero_attn
        ):
            return super().forward(
                query,
                key,
                value,
                key_padding_mask=key_padding_mask,
                incremental_state=incremental_state,
                need_weights=need_weights,
                static_kv=static_kv,
                attn_mask=attn_mask,
                before_softmax=before_softmax,
                need_head_weights=need_head_weights,
            )
        n, bsz, dim = query.size()

        def heads(x):  # (n, batch, dim) -> (batch, heads, n, head_dim)
            return x.view(n, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

        q = heads(self.q_proj(query) * self.scaling)
        out = banded_attention(
            q, heads(self.k_proj(query)), heads(self.v_proj(query)), self.window, key_padding_mask, self.dropout_module
        )
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(n, bsz, dim)), None


class WindowedDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with ``WindowedSelfAttention`` (``build_self_attention`` hook)."""

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False) -> WindowedSelfAttention:
        # the arguments of fairseq's TransformerDecoderLayerBase.build_self_attention
        return WindowedSelfAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )


class WindowedTransformerDecoder(TransformerDecoder):
    """fairseq's TransformerDecoder with the causal mask replaced by the window mask.

    ``buffered_future_mask`` (the hook fairseq uses to build the
    self-attention mask of every layer) gives the window mask, used by the
    masked reference; ``build_decoder_layer`` gives layers whose
    self-attention computes the window banded (``banded``).
    """

    def __init__(self, args, dictionary, embed_tokens, window: Window, banded: bool = True):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=False)
        self.window = parse_window(window)
        self.banded = banded  # also tells every layer's attention its window

    @property
    def banded(self) -> bool:
        """Banded window attention (default) or fairseq's masked attention (the reference)."""
        return self._banded

    @banded.setter
    def banded(self, value: bool) -> None:
        self._banded = bool(value)
        for layer in self.layers:
            attn = layer.self_attn
            attn.window, attn.banded = self.window, self._banded

    def build_decoder_layer(self, args, no_encoder_attn=False) -> torch.nn.Module:
        # fairseq's TransformerDecoderBase.build_decoder_layer with our layer class
        cfg = TransformerConfig.from_namespace(args)
        layer = WindowedDecoderLayer(cfg, no_encoder_attn)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)

    def buffered_future_mask(self, tensor) -> torch.Tensor:
        dim = tensor.size(0)
        if self._future_mask.size(0) < dim or self._future_mask.device != tensor.device:
            self._future_mask = window_attention_mask(dim, self.window, tensor.device)
        self._future_mask = self._future_mask.to(tensor)
        return self._future_mask[:dim, :dim]

    def extract_features_scriptable(
        self, prev_output_tokens, encoder_out, incremental_state=None, *args, **kwargs
    ) -> Tuple[torch.Tensor, Dict[str, List[Optional[torch.Tensor]]]]:
        if incremental_state is not None and self.window != FULL:
            # fairseq's incremental decoding caches every previous key and
            # would silently widen the window; generation is not a use case of
            # the weak decoder (it exists only for the pre-training loss).
            raise NotImplementedError("incremental decoding is not supported with a restricted attention window")
        return super().extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state, *args, **kwargs)
