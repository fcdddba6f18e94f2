"""Every driver under examples/ prints its --help and exits 0.

A help text is formatted only when asked for: argparse %-formats it then, so a bare ``%`` in one
option's help (``f"{share:.0%} of ..."``) crashed ``adapt.py --help`` while every run worked.
"""

import runpy
import sys

import pytest
from helpers import REPO

DRIVERS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "examples").rglob("*.py"))


def test_the_drivers_are_found():
    assert {"examples/adapt.py", "examples/adaptation_study.py", "examples/retrieval/finetune.py"} <= set(DRIVERS)


@pytest.mark.parametrize("driver", DRIVERS)
def test_help_is_printed(driver, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [driver, "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(REPO / driver), run_name="__main__")
    assert stop.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out
