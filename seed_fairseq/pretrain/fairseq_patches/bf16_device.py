"""``--bf16`` on the CUDA device (or the CPU with ``--cpu``) when there is no TPU (fix 11).

fairseq 0.12's ``options.parse_args_and_arch`` sets ``args.tpu = True`` whenever ``--bf16``
(or ``--memory-efficient-bf16``) is given: its bf16 path was written for TPUs.  On a
machine without ``torch_xla`` that run cannot start (``Trainer`` asks
``utils.get_tpu_device()``, which imports ``torch_xla``), so ``fairseq-train --bf16`` never
runs on a GPU.  Everything else of fairseq's bf16 path is device-independent: the model and
criterion cast to bfloat16 (``Trainer.__init__``), floating samples cast
(``Trainer._prepare_sample``), fp32 master weights kept unflattened and no loss scaler
(``FP16Optimizer`` with ``cfg.common.bf16``).

The fix turns ``tpu`` back off for a bf16 namespace when ``torch_xla`` is not importable,
where the namespace becomes the run's config: ``convert_namespace_to_omegaconf``, both in
``fairseq.dataclass.utils`` and in fairseq-train's module, which imported it by name (the
plugin is imported inside fairseq-train's first ``parse_args_and_arch`` call, too late to
wrap that call; the config is built right after it, before anything reads ``tpu``).  It
changes only runs that could not start: with ``torch_xla`` installed, ``--bf16`` keeps
fairseq's meaning (a TPU).  ``fairseq-hydra-train`` (configs, no namespace) is not covered.
"""

import argparse
import functools
import importlib.util

from ._common import MARK, fairseq_train_modules, logger, mark

_said = False


def xla_available() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def bf16_without_tpu(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``tpu`` off when fairseq turned it on for ``--bf16`` and there is no TPU."""
    global _said
    if getattr(args, "bf16", False) and getattr(args, "tpu", False) and not xla_available():
        args.tpu = False
        if not _said:
            _said = True
            logger.info(
                "--bf16: bfloat16 on %s (fairseq 0.12 reads --bf16 as --tpu; torch_xla is not installed)",
                "the CPU" if getattr(args, "cpu", False) else "the CUDA device",
            )
    return args


def _wrap(convert):
    @functools.wraps(convert)
    def convert_namespace_to_omegaconf(args):
        return convert(bf16_without_tpu(args))

    return mark(convert_namespace_to_omegaconf, __name__)


def install() -> None:
    """Wrap ``convert_namespace_to_omegaconf`` in ``fairseq.dataclass.utils``, and in the module of
    fairseq-train when this process runs it (``_common.fairseq_train_modules``) (idempotent)."""
    import fairseq.dataclass.utils as dataclass_utils

    for module in (dataclass_utils, *fairseq_train_modules()):
        convert = getattr(module, "convert_namespace_to_omegaconf", None)
        if callable(convert) and not getattr(convert, MARK, None):
            module.convert_namespace_to_omegaconf = _wrap(convert)
