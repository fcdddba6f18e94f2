"""Characters that carry no text, shared by the corpus normaliser and the tokenizers.

Control characters (Unicode category Cc) that are not whitespace would otherwise
become byte-fallback pieces or unknown tokens: ``preprocess.text`` drops them
from every line, and ``hf.tokenizer`` adds the same rule to an exported
tokenizer's normaliser, so a model sees the same text in both places.
"""

import re

CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
