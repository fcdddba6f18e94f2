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
"""

from typing import Dict, List, Optional, Tuple, Union

import torch
from fairseq.models.transformer import TransformerDecoder

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


class WindowedTransformerDecoder(TransformerDecoder):
    """fairseq's TransformerDecoder with the causal mask replaced by the window mask.

    Only ``buffered_future_mask`` (the hook fairseq uses to build the
    self-attention mask of every layer) is changed.
    """

    def __init__(self, args, dictionary, embed_tokens, window: Window):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=False)
        self.window = parse_window(window)

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
