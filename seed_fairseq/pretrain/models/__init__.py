from typing import Optional, Type

from .bottleneck import BottleneckEncoderModel  # noqa: F401
from .cpdae import CpdaeModel  # noqa: F401
from .retromae import RetroMAEModel  # noqa: F401
from .seed_encoder import SeedEncoderModel  # noqa: F401
from .simlm import SimLMModel  # noqa: F401


def pretraining_model_class(name: str) -> Optional[Type[BottleneckEncoderModel]]:
    """The plugin's pre-training model class behind a fairseq model/arch name, or None."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

    cls = MODEL_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(name, name))
    return cls if isinstance(cls, type) and issubclass(cls, BottleneckEncoderModel) else None
