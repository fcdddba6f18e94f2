"""The install-time edit of fairseq (``fairseq_patches/lazy_metrics.py``, run by ``scripts/setup_env.sh``):
scikit-learn and scipy.stats imported on first use, not at every ``fairseq-train`` start."""

import errno
import os
import site as sitelib
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from seed_fairseq.pretrain.fairseq_patches import lazy_metrics

STOCK = (
    "import torch\r\n"
    "from sklearn.metrics import f1_score\r\n"
    "from sklearn.metrics import matthews_corrcoef as _matthews_corrcoef\r\n"
    "from scipy.stats import pearsonr, spearmanr\r\n"
    "\r\n"
    "X = 1\r\n"
)


def test_the_lines_are_replaced_in_place_and_once():
    edits = lazy_metrics.EDITS["criterions/sentence_prediction.py"]
    new = lazy_metrics.rewrite(STOCK, edits)
    lines = new.split("\r\n")
    assert len(lines) == len(STOCK.split("\r\n")) and lines[0] == "import torch" and lines[5] == "X = 1"
    assert all(lazy_metrics.MARK in line for line in lines[1:4]) and "\n" not in new.replace("\r\n", "")
    assert lazy_metrics.rewrite(new, edits) == new  # idempotent
    with pytest.raises(ValueError, match="not found: from scipy.stats import pearsonr, spearmanr"):
        lazy_metrics.rewrite(STOCK.replace("pearsonr, spearmanr", "pearsonr"), edits)


def test_the_names_compute_what_the_libraries_do():
    import numpy as np
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import f1_score, matthews_corrcoef, roc_curve

    space = {}
    exec(lazy_metrics.rewrite(STOCK, lazy_metrics.EDITS["criterions/sentence_prediction.py"]), space)
    y, p = np.array([0, 1, 1, 0, 1]), np.array([0, 1, 0, 0, 1])
    assert space["f1_score"](y_true=y, y_pred=p) == f1_score(y_true=y, y_pred=p)
    assert space["_matthews_corrcoef"](y, p) == matthews_corrcoef(y, p)
    a, b = np.array([1.0, 2.0, 3.0, 5.0]), np.array([1.0, 2.5, 2.0, 7.0])
    assert space["pearsonr"](a, b)[0] == pearsonr(a, b)[0] and space["spearmanr"](a, b)[0] == spearmanr(a, b)[0]
    (line,) = lazy_metrics.EDITS["tasks/audio_classification.py"].values()
    exec(line, space)
    assert space["sklearn_metrics"].roc_curve is roc_curve


def test_fairseq_train_starts_without_sklearn():
    """The installed fairseq (setup_env.sh edited it): its start imports neither."""
    probe = "import sys, fairseq_cli.train; print(sorted(m for m in ('sklearn', 'scipy.stats') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


# --- issue 43 F: only the target venv's site-packages is edited, modes kept, never a traceback ---

AUDIO = "import os\nfrom sklearn import metrics as sklearn_metrics\n"
REPO = Path(__file__).resolve().parents[1]


def make_fairseq(parent: Path) -> Path:
    """A fake fairseq in ``parent``: the two files with the lines the edit expects."""
    root = parent / "fairseq"
    (root / "tasks").mkdir(parents=True)
    (root / "criterions").mkdir()
    (root / "__init__.py").write_text("")
    (root / "tasks" / "audio_classification.py").write_text(AUDIO)
    (root / "criterions" / "sentence_prediction.py").write_bytes(STOCK.encode())
    return root


def contents(root: Path) -> dict:
    """Every file under ``root``: its bytes and permission bits (temporary files included)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def edited(path: Path) -> bool:
    return lazy_metrics.MARK in path.read_text()


def run_main(monkeypatch, capsys, root: Path, site: Path):
    """``main()`` in this process with ``root`` as the fairseq found and ``site`` as the venv's
    site-packages: (exit status, the lines printed)."""
    monkeypatch.setattr(lazy_metrics, "fairseq_folder", lambda: root)
    monkeypatch.setattr(lazy_metrics, "site_packages", lambda: [site.resolve()])
    status = lazy_metrics.main()
    captured = capsys.readouterr()
    return status, (captured.out + captured.err).splitlines()


def test_the_files_keep_their_modes(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site-packages"
    root = make_fairseq(site)
    audio, criterion = root / "tasks" / "audio_classification.py", root / "criterions" / "sentence_prediction.py"
    audio.chmod(0o755)
    criterion.chmod(0o640)
    status, lines = run_main(monkeypatch, capsys, root, site)
    assert status == 0 and len(lines) == 1 and "imported on first use" in lines[0], lines
    assert edited(audio) and edited(criterion)
    assert stat.S_IMODE(audio.stat().st_mode) == 0o755 and stat.S_IMODE(criterion.stat().st_mode) == 0o640
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == sorted(
        ["__init__.py", "audio_classification.py", "sentence_prediction.py"]
    )  # no temporary file left


def read_only_folder(path: Path):
    """``temp_path_beside`` as in a read-only folder ``path`` (root can write any folder: injected)."""
    real = lazy_metrics.temp_path_beside

    def temp_path_beside(target, suffix=""):
        if Path(target).parent == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(path / ".x.tmp-1"))
        return real(target, suffix)

    return temp_path_beside


def test_a_read_only_folder_is_left_with_one_line(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site-packages"
    root = make_fairseq(site)
    before = contents(root / "tasks")
    monkeypatch.setattr(lazy_metrics, "temp_path_beside", read_only_folder((root / "tasks").resolve()))
    status, lines = run_main(monkeypatch, capsys, root, site)
    audio = root / "tasks" / "audio_classification.py"
    assert status == 0 and lines == [f"fairseq: {audio}: cannot write it: Permission denied; left as it is"]
    assert contents(root / "tasks") == before
    assert edited(root / "criterions" / "sentence_prediction.py")  # the other folder is writable


def test_a_failed_rename_leaves_the_file_and_no_temporary_file(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site-packages"
    root = make_fairseq(site)
    (root / "criterions" / "sentence_prediction.py").chmod(0o640)
    before = contents(root / "criterions")
    real = os.replace

    def replace(src, dst, *a, **k):
        if Path(dst).parent.name == "criterions":
            raise OSError(errno.EROFS, "Read-only file system", str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(lazy_metrics.os, "replace", replace)
    status, lines = run_main(monkeypatch, capsys, root, site)
    criterion = root / "criterions" / "sentence_prediction.py"
    assert status == 0 and lines == [f"fairseq: {criterion}: cannot write it: Read-only file system; left as it is"]
    assert contents(root / "criterions") == before  # unchanged, mode included, no temporary file


def test_a_read_only_file_is_left_with_one_line(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site-packages"
    root = make_fairseq(site)
    audio = root / "tasks" / "audio_classification.py"
    audio.chmod(0o444)
    before = contents(root / "tasks")
    real = os.access  # root may write a 0o444 file: the user's answer is injected

    def access(path, mode, *a, **k):
        return False if Path(path).resolve() == audio.resolve() and mode & os.W_OK else real(path, mode, *a, **k)

    monkeypatch.setattr(lazy_metrics.os, "access", access)
    status, lines = run_main(monkeypatch, capsys, root, site)
    assert status == 0 and lines == [f"fairseq: {audio}: cannot write it: the file is read-only; left as it is"]
    assert contents(root / "tasks") == before


def test_a_linked_file_is_not_written_through(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site-packages"
    root = make_fairseq(site)
    audio = root / "tasks" / "audio_classification.py"
    target = site / "elsewhere.py"  # inside site-packages even: a link is never written through
    audio.rename(target)
    audio.symlink_to(target)
    status, lines = run_main(monkeypatch, capsys, root, site)
    assert status == 0 and lines == [f"fairseq: {audio}: a symbolic link (never written through); left as it is"]
    assert audio.is_symlink() and target.read_text() == AUDIO


def test_a_linked_fairseq_outside_the_venv_is_left(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site-packages"
    site.mkdir()
    checkout = make_fairseq(tmp_path / "checkout")
    before = contents(checkout)
    (site / "fairseq").symlink_to(checkout, target_is_directory=True)
    status, lines = run_main(monkeypatch, capsys, site / "fairseq", site)
    assert status == 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"fairseq: {site / 'fairseq'}: not in this venv's site-packages (")
    assert contents(checkout) == before


def script_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(extra)
    return env


@pytest.mark.slow
def test_a_fairseq_on_pythonpath_is_left_byte_identical(tmp_path):
    root = make_fairseq(tmp_path / "elsewhere")
    before = contents(root)
    proc = subprocess.run(
        [sys.executable, "-m", "seed_fairseq.pretrain.fairseq_patches.lazy_metrics"],
        cwd=REPO,
        env=script_env(PYTHONPATH=str(tmp_path / "elsewhere")),
        capture_output=True,
        text=True,
    )
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(f"fairseq: {root}: not in this venv's site-packages (") and lines[0].endswith(
        "); left as it is"
    ), lines
    assert contents(root) == before


@pytest.mark.slow
def test_the_target_venvs_fairseq_is_edited(tmp_path):
    """A venv of its own (no pip), a fake fairseq in its site-packages, this venv's packages after
    it (torch): the venv's python edits its own fairseq, keeping the modes."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    site = Path(purelib)
    (site / "_this_venv.pth").write_text("\n".join(sitelib.getsitepackages()) + "\n")
    root = make_fairseq(site)
    audio, criterion = root / "tasks" / "audio_classification.py", root / "criterions" / "sentence_prediction.py"
    audio.chmod(0o755)
    criterion.chmod(0o640)
    proc = subprocess.run(
        [str(python), "-m", "seed_fairseq.pretrain.fairseq_patches.lazy_metrics"],
        cwd=REPO,
        env=script_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "imported on first use" in proc.stdout, proc.stdout + proc.stderr
    assert edited(audio) and edited(criterion)
    assert stat.S_IMODE(audio.stat().st_mode) == 0o755 and stat.S_IMODE(criterion.stat().st_mode) == 0o640
