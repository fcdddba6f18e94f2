from .windowed_decoder import (  # noqa: F401
    FULL,
    WindowedTransformerDecoder,
    parse_window,
    receptive_field,
    window_allowed,
    window_attention_mask,
)
