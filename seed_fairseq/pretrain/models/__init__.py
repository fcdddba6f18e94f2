"""The pre-training models, one module per objective (``seed_fairseq.plugin`` imports every module here)."""

from typing import Optional, Type

from .bottleneck import BottleneckEncoderModel


def pretraining_model_class(name: str) -> Optional[Type[BottleneckEncoderModel]]:
    """The plugin's pre-training model class behind a fairseq model/arch name, or None."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

    cls = MODEL_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(name, name))
    return cls if isinstance(cls, type) and issubclass(cls, BottleneckEncoderModel) else None
