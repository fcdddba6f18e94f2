from .. import plugin  # noqa: F401  (registration first: see seed_fairseq/__init__.py)

# isort: split
from .windowed_decoder import (  # noqa: F401
    FULL,
    WindowedTransformerDecoder,
    parse_window,
    receptive_field,
    window_allowed,
    window_attention_mask,
)
