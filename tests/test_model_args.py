"""Every architecture of the plugin accepts every option an imported model's model_args.txt
holds (``seed_fairseq/encoders/hf/import_.py: model_args``), and every model's ``add_args`` reaches
its base's (checked when the class is created)."""

import pytest
import torch
from conftest import build_task_model

from seed_fairseq.encoders.hf.import_ import model_args
from seed_fairseq.pretrain.models import BottleneckEncoderModel, pretraining_model_class

# a BERT config.json as import_.py reads it (odd sizes, BERT's LayerNorm epsilon)
BERT_CONFIG = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_attention_heads": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
}


def plugin_archs():
    from fairseq.models import ARCH_MODEL_REGISTRY

    return sorted(name for name in ARCH_MODEL_REGISTRY if pretraining_model_class(name) is not None)


def test_every_model_of_the_plugin_has_archs():
    models = {pretraining_model_class(a).__name__ for a in plugin_archs()}
    assert models >= {"SeedEncoderModel", "RetroMAEModel", "SimLMModel", "CpdaeModel"}
    assert {"retromae_tiny", "dupmae_tiny", "simlm_tiny", "cpdae_tiny", "seed_encoder_tiny"} <= set(plugin_archs())


@pytest.mark.parametrize("arch", plugin_archs())
def test_every_arch_accepts_the_imported_model_args(odd_dict_dir, arch):
    args = model_args(BERT_CONFIG, max_positions=64)
    _, model, _, cfg = build_task_model(odd_dict_dir, arch_args=["--arch", arch, *args])
    assert cfg.model.encoder_layer_norm_eps == 1e-12 and cfg.model.max_positions == 64
    norms = [m for m in model.encoder.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(m.eps == 1e-12 for m in norms)
    assert len(model.encoder.sentence_encoder.layers) == 2


def test_an_add_args_that_skips_its_base_is_refused_when_the_class_is_made():
    from fairseq.models.roberta import RobertaModel

    with pytest.raises(TypeError, match=r"must call its base's add_args.*--encoder-layer-norm-eps"):

        class SkipsTheBase(BottleneckEncoderModel):
            @staticmethod
            def add_args(parser):
                RobertaModel.add_args(parser)

    class ReachesTheBase(BottleneckEncoderModel):
        @staticmethod
        def add_args(parser):
            BottleneckEncoderModel.add_args(parser)
            parser.add_argument("--toy-option", type=int)

    with pytest.raises(TypeError, match=r"--toy-option"):  # a subclass of a subclass: its own base's options

        class SkipsItsOwnBase(ReachesTheBase):
            @staticmethod
            def add_args(parser):
                BottleneckEncoderModel.add_args(parser)
