"""Ctrl-C in the middle of an in-process checkpoint save (issue 32, item 10).

torch's writer turns whatever stops a ``write`` into ``RuntimeError("... unexpected pos ...")``:
a Ctrl-C during the save of ``seed-drop-heads``, the import (also compare's) became a
traceback and exit 1.  The shared save (``checkpoint_files.torch_save`` / ``save_atomic``) raises
what stopped it; the tools say "interrupted" and exit 130, and the write stays atomic.  A
real signal, raised in this process while torch writes the file (the test's file object
raises it on its third write): in process, as the tools' ``main`` runs it.
"""

import builtins
import os
import signal

import pytest
import torch
from helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "seed_fairseq_0.1"


@pytest.fixture
def signal_during_save(monkeypatch):
    """``arm(signum)``: the next file ``checkpoint_files.torch_save`` writes gets ``signum`` on its 3rd write."""
    from seed_fairseq.pretrain import checkpoint_files

    armed = []

    class Signalling:
        def __init__(self, f, signum):
            self.f, self.signum, self.writes = f, signum, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                signal.raise_signal(self.signum)  # its handler runs at the next bytecode, in here
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def opening(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        return Signalling(f, armed.pop()) if armed and "w" in mode else f

    monkeypatch.setattr(checkpoint_files, "open", opening, raising=False)
    return armed.append


def test_the_shared_save_raises_what_stopped_it(signal_during_save, tmp_path):
    from seed_fairseq.pretrain.checkpoint_files import save_atomic

    state = {"model": {"w": torch.zeros(1000)}}
    target = tmp_path / "checkpoint.pt"
    signal_during_save(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        save_atomic(state, target)
    assert list(tmp_path.iterdir()) == []  # atomic: no file, no staging file

    def exits(signum, frame):  # what the tools' SIGTERM handler does (fileio._exit_on_sigterm)
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, exits)
    try:
        signal_during_save(signal.SIGTERM)
        with pytest.raises(SystemExit) as stopped:
            save_atomic(state, target)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.code == 128 + signal.SIGTERM and list(tmp_path.iterdir()) == []
    save_atomic(state, target)  # and without a signal it writes
    assert torch.equal(torch.load(target, weights_only=True)["model"]["w"], state["model"]["w"])


def _one_interrupted_line(code, err):
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "RuntimeError" not in err, err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("interrupted")], err[-3000:]


def test_drop_heads_interrupted_while_writing(signal_during_save, tmp_path, capsys):
    from seed_fairseq.encoders.drop_heads import main

    out = tmp_path / "out" / "encoder.pt"
    out.parent.mkdir()
    signal_during_save(signal.SIGINT)
    code = main([str(FIXTURE / "checkpoint_1_3.pt"), str(out), "--data", str(FIXTURE / "data-bin")])
    _one_interrupted_line(code, capsys.readouterr().err)
    assert os.listdir(out.parent) == []


def test_import_interrupted_while_writing(signal_during_save, tmp_path, capsys):
    from helpers import load_driver
    from hf_models import save_roberta

    hf = save_roberta(tmp_path / "hf")
    signal_during_save(signal.SIGINT)
    code = load_driver("examples/import_from_hf.py").main(["--model", str(hf), "--out", str(tmp_path / "imp")])
    _one_interrupted_line(code, capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == ["hf"]  # neither the import nor its staging folder
