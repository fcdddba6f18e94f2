"""Known-harmless warnings of a fairseq 0.12 run, filtered once, here, by message and category.

Every CPU ``fairseq-train`` printed nine of them (30 lines) before its first useful line:
hydra's deprecations of the API fairseq 0.12 calls (``hydra.experimental``, ``version_base``,
``# @package _group_``, ConfigStore schema matching, ``strict``), torch's ``pin_memory`` note
on a machine without an accelerator, and the deprecation of the ``torch.cuda.amp.autocast``
that fairseq's ``train_step`` enters (disabled) on every update.  None says anything the user can
act on.  Each filter matches one message of one category: any other warning, of these libraries
too, still shows.  A run started with ``-W`` options or ``PYTHONWARNINGS`` (``sys.warnoptions``)
keeps exactly the filters the user asked for: ``PYTHONWARNINGS=default`` shows these again.
"""

import sys
import warnings
from typing import Tuple, Type

# (category, regex matched at the start of the message, where it comes from)
KNOWN_HARMLESS: Tuple[Tuple[Type[Warning], str, str], ...] = (
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental", "hydra, fairseq's"),
    (UserWarning, r"\s*The version_base parameter is not specified", "hydra, fairseq's initialize()"),
    (UserWarning, r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'", "hydra"),
    (UserWarning, r"\s*'[^']*' is validated against ConfigStore schema with the same name", "hydra"),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated", "hydra, fairseq's compose()"),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found", "torch, on a CPU"),
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", "fairseq's train_step"),
)

_installed = False


def install() -> None:
    """Ignore the :data:`KNOWN_HARMLESS` warnings (idempotent; nothing under ``-W``/``PYTHONWARNINGS``)."""
    global _installed
    if _installed or sys.warnoptions:
        return
    _installed = True
    for category, message, _ in KNOWN_HARMLESS:
        warnings.filterwarnings("ignore", message=message, category=category)
