"""The retrieval and comparison libraries import without fairseq, and DupMAE's representation
is found through the registries (entry points) without ``retrieval`` or ``hf`` importing it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def library_modules(*packages):
    names = []
    for package in packages:
        folder = REPO.joinpath(*package.split("."))
        names.append(package)
        names.extend(f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__")
    return names


def fresh_import(modules, check):
    """Import ``modules`` one by one in a fresh interpreter; after each, ``check`` (an expression
    over ``sys.modules``) must hold.  Returns the modules after which it did not."""
    code = (
        "import importlib, json, sys\n"
        "bad = []\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"    if not ({check}):\n"
        "        bad.append(m)\n"
        "print(json.dumps(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "package", ["seed_fairseq.encoders.retrieval", "seed_fairseq.workflows.compare", "seed_fairseq.encoders.dupmae"]
)
def test_library_imports_without_fairseq(package):
    modules = library_modules(package)
    assert len(modules) > 3
    assert fresh_import(modules, "'fairseq' not in sys.modules") == []


def test_retrieval_does_not_import_dupmae():
    modules = library_modules("seed_fairseq.encoders.retrieval")
    assert fresh_import(modules, "not any(k.startswith('seed_fairseq.encoders.dupmae') for k in sys.modules)") == []


def test_dupmae_is_registered_through_the_entry_points():
    from seed_fairseq.encoders.hf import representation as exporters
    from seed_fairseq.encoders.retrieval import representations

    assert representations.names() == ("own", "cls", "dupmae")
    assert exporters.names() == ("own", "cls", "dupmae")
    from seed_fairseq.encoders.dupmae.export import EXPORTER
    from seed_fairseq.encoders.dupmae.retriever import REPRESENTATION, DupMAERetriever

    assert representations.get("dupmae") is REPRESENTATION and REPRESENTATION.retriever is DupMAERetriever
    assert exporters.get("dupmae") is EXPORTER
    assert exporters.default_for({"criterion": {"_name": "dupmae_pretrain"}}) is EXPORTER
    assert exporters.default_for({"criterion": {"_name": "seed_pretrain"}}) is exporters.OWN
    assert exporters.owner_of("dupmae_top_k") is EXPORTER
    with pytest.raises(ValueError, match=r"representation must be one of \('own', 'cls', 'dupmae'\), got 'x'"):
        representations.get("x")
    with pytest.raises(exporters.ExportError, match="--representation must be own, cls or dupmae, got 'x'"):
        exporters.get("x")


def _parse(argv):
    import argparse

    from seed_fairseq.encoders.retrieval.cli import add_search_args
    from seed_fairseq.encoders.retrieval.config import FinetuneConfig

    p = argparse.ArgumentParser()
    FinetuneConfig.add_args(p)
    add_search_args(p)
    return FinetuneConfig.from_args(p.parse_args(argv))


def test_finetune_config_round_trips_through_its_flags():
    from dataclasses import replace

    from seed_fairseq.encoders.retrieval.config import FinetuneConfig

    # the search options' defaults (--batch-size 64) are encoding's, not FinetuneConfig's (128)
    assert _parse([]) == replace(FinetuneConfig(), encode_batch_size=64)
    cfg = _parse(["--train-batch-size", "8", "--negatives", "ance", "--no-progress"])
    assert (cfg.batch_size, cfg.negatives, cfg.show_progress) == (8, "ance", False)


def test_comparison_keeps_its_flag_names_and_defaults():
    from seed_fairseq.workflows.compare import cli

    args = cli.parser().parse_args([])
    got = {k: getattr(args, k) for k in ("negatives", "loss", "num_negatives", "encode_batch_size", "index")}
    assert got == {"negatives": "bm25", "loss": "mnrl", "num_negatives": 1, "encode_batch_size": 64, "index": "flat"}
    assert (args.ft_epochs, args.ft_batch_size, args.ft_lr) == (None, None, None)  # the preset's
    args = cli.parser().parse_args(["--ft-batch-size", "4", "--ft-lr", "1e-4", "--ft-epochs", "2"])
    cfg = cli.config_from_args(args, cli.FINETUNE_FLAGS, show_progress=False)
    assert (cfg.batch_size, cfg.lr, cfg.epochs, cfg.encode_batch_size) == (4, 1e-4, 2, 64)


def test_the_similarity_rule_reads_the_tools_own_records():
    """hf/sentence.py names the records of the export and of fine-tuning without importing them."""
    from seed_fairseq.encoders.hf.export import EXPORT_RECORD
    from seed_fairseq.encoders.hf.sentence import TOOL_RECORDS
    from seed_fairseq.encoders.retrieval.training import RECORD, TOOL

    assert TOOL_RECORDS == {EXPORT_RECORD: ("seed_fairseq.hf.export",), RECORD: (TOOL,)}
