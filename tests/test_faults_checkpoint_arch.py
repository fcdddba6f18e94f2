"""Every architecture fact a checkpoint records reaches the tools that rebuild its encoder
(issue 32, item 2): ``seed-drop-heads``, the HuggingFace export and DupMAE's exported head,
for every objective, on a checkpoint continued from a BERT import (LayerNorm eps 1e-12, its
own id order), from a RoBERTa import and from scratch.

Cheap: tiny models (hidden 32, FFN 37) made here, every "continued" checkpoint is the start
model loaded into the objective's model and moved by a small deterministic step (what an
update does to it), written in process; the tools run in process.
"""

import shlex

import pytest
import torch
from helpers import parse_argv
from hf_models import save_bert, save_roberta
from objectives import OBJECTIVES, TINY_ENCODER

SOURCES = ("bert", "roberta", "scratch")


@pytest.fixture(scope="module")
def starts(tmp_path_factory, demo_data_bin):
    """source -> (data folder, encoder options, start checkpoint or None, eps the encoder computes with);
    an import folder is the data folder of its continued checkpoints (dict.txt and tokenizer)"""
    from seed_fairseq.encoders.hf.import_ import import_model

    root = tmp_path_factory.mktemp("arch")
    out = {"scratch": (demo_data_bin, list(TINY_ENCODER), None, 1e-5)}
    for family, save in (("bert", save_bert), ("roberta", save_roberta)):
        imp = import_model(save(root / f"hf_{family}"), root / f"import_{family}")
        args = shlex.split((imp / "model_args.txt").read_text())
        out[family] = (imp, args, imp / "checkpoint.pt", 1e-12 if family == "bert" else 1e-5)
    return out


def continued(obj, start, path):
    """(path, model): a checkpoint of ``obj`` continued from ``start`` -- its model built by
    fairseq's own option parsing, the start loaded (the objective's heads fresh), every weight
    moved a little -- and that model in eval mode (what the checkpoint computes)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from seed_fairseq.encoders.hf.import_ import checkpoint_dict
    from seed_fairseq.pretrain.checkpoint import load_torch_file
    from seed_fairseq.pretrain.checkpoint_files import save_atomic

    data, encoder_args, start_ckpt, _ = start
    # SimLM's generator: read by training only, never by these tools
    objective = obj.args(model=(), **{fixture: start_ckpt or path for _, fixture in obj.needs})
    ns = options.parse_args_and_arch(
        options.get_training_parser(),
        parse_argv(data, [*objective, *encoder_args, "--tokens-per-sample", "48", "--cpu"]),
    )
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    if start_ckpt is not None:
        state = load_torch_file(start_ckpt)
        model.load_state_dict(dict(state["model"]), strict=True, model_cfg=cfg.model)
    g = torch.Generator().manual_seed(len(obj.name))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    save_atomic(checkpoint_dict(cfg, model, task, {"source": "test"}), path)
    return path, model.eval()


_CONTINUED = {}


def checkpoints(source, starts, tmp_path_factory):
    """objective name -> (checkpoint continued from ``source``, its model) (made once per module)."""
    if source not in _CONTINUED:
        root = tmp_path_factory.mktemp(f"continued_{source}")
        _CONTINUED[source] = {o.name: continued(o, starts[source], root / f"{o.name}.pt") for o in OBJECTIVES}
    return _CONTINUED[source]


def plugin_model(ckpt, data):
    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401

    (model,), _ = checkpoint_utils.load_model_ensemble([str(ckpt)], arg_overrides={"data": str(data)})
    return model.eval()


def probe(model):
    d = model.encoder.dictionary
    tokens = torch.randint(d.nspecial, len(d) - 1, (3, 19), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = d.bos()
    tokens[:, -1] = d.eos()
    tokens[1, 11:] = d.pad()
    return tokens


def outputs(model, tokens):
    with torch.no_grad():
        return model(tokens, features_only=True)[0], model(tokens)[0]


def layer_norm_eps(model):
    return {m.eps for m in model.encoder.modules() if isinstance(m, torch.nn.LayerNorm)}


@pytest.mark.parametrize("source", SOURCES)
def test_drop_heads_keeps_every_architecture_fact(source, starts, tmp_path, tmp_path_factory):
    from seed_fairseq.encoders.drop_heads import write_encoder_checkpoint
    from seed_fairseq.pretrain.checkpoint import load_torch_file

    data, _, _, eps = starts[source]
    made = checkpoints(source, starts, tmp_path_factory)
    for obj in OBJECTIVES:
        ckpt, full = made[obj.name]
        out = write_encoder_checkpoint(ckpt, tmp_path / f"{obj.name}-encoder.pt")
        state = load_torch_file(out)
        # stock roberta where it computes the same; the plugin's encoder-only arch where it cannot (eps)
        arch = "seed_encoder_mlm_only" if eps != 1e-5 else "roberta"
        assert state["cfg"]["model"]["_name"] == arch, obj.name
        encoder = plugin_model(out, data)
        assert layer_norm_eps(encoder) == layer_norm_eps(full) == {eps}, obj.name
        assert not any(k.startswith(obj.heads or ("\0",)) for k in state["model"]), obj.name
        tokens = probe(full)
        for ours, theirs in zip(outputs(encoder, tokens), outputs(full, tokens)):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6, msg=obj.name)


def folder_ids(data, n_symbols):
    """The exported folder's id of each fairseq id (an import of BERT reorders them)."""
    import json

    from seed_fairseq.base.vocabulary.tokenizer import fairseq_to_hf_from_record

    record = data / "hf_tokenizer.json"
    if not record.is_file():
        return torch.arange(n_symbols)
    return torch.as_tensor(fairseq_to_hf_from_record(json.loads(record.read_text())))


@pytest.mark.parametrize("source", SOURCES)
def test_export_keeps_every_architecture_fact(source, starts, tmp_path, tmp_path_factory):
    """Every objective, exported with DupMAE's head (its MLM head: LayerNorm eps and the id order
    count), and the encoder-only checkpoint of one; each checked against fairseq here."""
    from transformers import AutoModel

    from seed_fairseq.encoders.drop_heads import write_encoder_checkpoint
    from seed_fairseq.encoders.dupmae.head import load_head
    from seed_fairseq.encoders.hf.export import export

    data, _, _, eps = starts[source]
    made = dict(checkpoints(source, starts, tmp_path_factory))
    last, fs = made[OBJECTIVES[-1].name]
    made["encoder-only"] = (write_encoder_checkpoint(last, tmp_path / "encoder.pt"), fs)  # computes the same
    for name, (ckpt, fs) in made.items():
        out = export(ckpt, data, tmp_path / f"hf-{name}", representation="dupmae")
        tokens = probe(fs)
        to_folder = folder_ids(data, len(fs.encoder.dictionary))
        ids, mask = to_folder[tokens], tokens.ne(1)
        hf, head = AutoModel.from_pretrained(str(out)).eval(), load_head(out).eval()
        assert head.head_config["layer_norm_eps"] == eps, name
        with torch.no_grad():
            features = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
            mu = head.vocabulary_vector(features, head.pool_positions(ids, mask.long()))
            fs_features = fs(tokens, features_only=True)[0]
            logits = fs.encoder.lm_head(fs_features)
        torch.testing.assert_close(features[mask], fs_features[mask], rtol=0, atol=1e-5, msg=name)
        # mu: fairseq's MLM logits max-pooled over the ordinary tokens, each at the folder's id
        pool = mask & tokens.ge(fs.encoder.dictionary.nspecial)
        reference = logits.masked_fill(~pool.unsqueeze(-1), float("-inf")).amax(1)
        torch.testing.assert_close(mu[:, to_folder], reference, rtol=0, atol=1e-4, msg=name)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_architecture_read_from_an_import_is_the_models(family, starts):
    """Every number of the HF config that the encoder computes with is read back from the import's
    checkpoint (``checkpoint_records.encoder_architecture``), and the export's config.json says the same."""
    import json

    from seed_fairseq.encoders.hf.export import ACTIVATIONS, hf_config
    from seed_fairseq.pretrain.checkpoint import load_torch_file
    from seed_fairseq.pretrain.checkpoint_records import encoder_architecture

    imp = starts[family][0]
    hf = json.loads((imp.parent / f"hf_{family}" / "config.json").read_text())
    model_cfg = load_torch_file(imp / "checkpoint.pt")["cfg"]["model"]
    arch = encoder_architecture(model_cfg)
    offset = 0 if family == "bert" else hf["pad_token_id"] + 1  # the import re-indexes the positions
    assert arch.layers == hf["num_hidden_layers"] and arch.embed_dim == hf["hidden_size"]
    assert arch.ffn_embed_dim == hf["intermediate_size"] and arch.attention_heads == hf["num_attention_heads"]
    assert arch.max_positions == hf["max_position_embeddings"] - offset
    assert ACTIVATIONS[arch.activation_fn] == hf["hidden_act"] and arch.layer_norm_eps == hf["layer_norm_eps"]
    exported = hf_config(model_cfg, hf["vocab_size"], with_lm_head=False)
    assert (exported.layer_norm_eps, exported.hidden_act) == (hf["layer_norm_eps"], hf["hidden_act"])
    assert exported.intermediate_size == hf["intermediate_size"]
