"""A wheelhouse: every file ``scripts/setup_env.sh --wheelhouse DIR`` installs from, offline.

Run by ``scripts/make_wheelhouse.sh`` on a machine that reaches the package index, with an
interpreter that has torch, setuptools and packaging (the project's ``.venv`` after
``scripts/setup_env.sh``): fairseq's sdist imports torch in its ``setup.py``, and pip reads an
sdist's metadata even when it only downloads it.

What goes into DIR (for one target Python and platform):

- fairseq's sdist (built on the target against the torch installed there, as the online set-up
  does) and its build requirements (setuptools, wheel, cython, numpy) as wheels;
- antlr4-python3-runtime's sdist and a wheel built from it here (pure Python: fairseq-fixed pins
  omegaconf 2.3.0 and hydra-core 1.3.2, which need ``==4.9.*``, and PyPI has no wheel of 4.9);
- wheels of every other requirement of the project, its extras and fairseq, for the target;
- torch only with ``--with-torch`` (the pinned CPU build): a GPU machine keeps its own CUDA torch.
  Without it, resolution sees a stub torch with no dependencies, so neither torch nor its CUDA
  packages are downloaded (the target's torch brought its own);
- never torchaudio (fairseq requires it, text training never imports it, the online set-up removes it);
- ``wheelhouse.json`` (target, extras, the fairseq sdist, build and install lists),
  ``requirements.txt`` (what setup_env.sh installs, markers evaluated for the target),
  ``requirements.lock`` (every file as ``name==version --hash=sha256:...``) and ``SHA256SUMS``
  (checked by setup_env.sh before it installs anything).

Dependency markers are evaluated by pip for the interpreter that runs it, so the wheels are
downloaded by a ``python3.X`` of the target version (this interpreter when the versions agree);
platform markers (``platform_machine``...) are this machine's.
"""

import argparse
import email.parser
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the torch scripts/setup_env.sh pins (the machine's local CPU build)
TORCH_PIN = "2.13.0"
FAIRSEQ_NAMES = {"fairseq", "fairseq-fixed"}
# never installed: fairseq requires it, text training never imports it (see setup.py)
DROPPED = {"torch", "torchaudio"}
# fairseq's build requirements (its pyproject.toml, less torch); setuptools >= 64 also installs
# the project in editable mode without build isolation; numpy pinned as scripts/setup_env.sh pins it
BUILD = ["setuptools>=64", "wheel", "cython", "numpy>=1.21.3,<2.3"]
# pure-Python dependencies with no wheel on PyPI: their sdist is built into a wheel here
SOURCE_ONLY = ["antlr4-python3-runtime==4.9.*"]
MANIFEST = ("wheelhouse.json", "requirements.txt", "requirements.lock", "SHA256SUMS")


class Refused(Exception):
    """Bad input: reported as one ``error:`` line, exit code 2."""


def log(message):
    print(message, flush=True)


def pip(python, *args, quiet=True):
    cmd = [str(python), "-m", "pip", *(["--quiet"] if quiet else []), *map(str, args)]
    log("+ " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # the machine's pip configuration may name find-links folders that are absent; not ours to report
    lines = [line for line in proc.stdout.splitlines() if "is ignored: it is neither a file" not in line]
    if proc.returncode:
        print("\n".join(lines[-40:]), file=sys.stderr)
        raise SystemExit(f"error: pip failed (exit {proc.returncode}): {' '.join(cmd[:6])} ...")
    return proc


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Refused(message)


def parse_args(argv):
    p = Parser(prog="make_wheelhouse.sh", description=__doc__.split("\n\n")[0])
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    p.add_argument("--python", default=here, help=f"target Python X.Y (default {here}, this interpreter's)")
    p.add_argument(
        "--platform",
        action="append",
        default=[],
        help="target platform tag, repeatable, e.g. manylinux_2_28_x86_64, manylinux_2_28_aarch64 "
        "(default: this machine's tags)",
    )
    p.add_argument("--out", required=True, type=Path, help="the wheelhouse folder (new, or one this script made)")
    p.add_argument("--extras", default="test", help="the project's extras, comma-separated (default: test)")
    p.add_argument("--with-torch", action="store_true", help=f"add the pinned torch=={TORCH_PIN}")
    args = p.parse_args(argv)
    m = re.fullmatch(r"3\.(\d+)", args.python)
    if not m:
        raise Refused(f"--python {args.python}: expected a version such as 3.11")
    if int(m.group(1)) < 11:
        raise Refused(f"--python {args.python}: the wheelhouse serves fairseq-fixed, which needs Python >= 3.11")
    args.extras = sorted({e.strip() for e in args.extras.split(",") if e.strip()})
    out = args.out
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "wheelhouse.json").is_file())):
        raise Refused(f"{out}: exists and is not a wheelhouse this script made")
    return args


def target_environment(python):
    from packaging.markers import default_environment

    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0")
    return env


def evaluate(requirements, env, extras=()):
    """``requirements`` (strings) whose markers hold in ``env`` for one of ``extras`` (or none), markers dropped."""
    from packaging.requirements import Requirement

    kept = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
            continue
        req.marker = None
        kept.append(req)
    return kept


def project_requirements(runner, env, extras, work):
    """setup.py's requirements for ``extras``, read through pip (no setup.py parsing here)."""
    report = work / "project.json"
    pip(runner, "install", "--dry-run", "--no-deps", "--ignore-installed", "--no-build-isolation",
        "--report", report, REPO)  # fmt: skip
    metadata = json.loads(report.read_text())["install"][0]["metadata"]
    known = set(metadata.get("provides_extra", []))
    unknown = [e for e in extras if e not in known]
    if unknown:
        raise Refused(f"--extras {','.join(unknown)}: setup.py has {','.join(sorted(known))}")
    return evaluate(metadata.get("requires_dist", []), env, extras)


def sdist_requirements(path, env):
    """Requires-Dist of an sdist's PKG-INFO (core metadata), markers evaluated in ``env``."""
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        info = email.parser.Parser().parsestr(tar.extractfile(member).read().decode("utf-8"))
    return evaluate(info.get_all("Requires-Dist") or [], env)


def stub_torch(folder):
    """A torch wheel with no files and no dependencies: what resolution sees instead of the real one."""
    version = f"{TORCH_PIN}+wheelhousestub"
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: wheelhouse\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return version


def platform_tags(tags):
    """``tags`` and, for ``manylinux_2_N_ARCH``, the older glibc tags it runs (pip before 23.3 takes
    ``--platform`` literally, and many wheels are tagged ``manylinux2014`` / ``manylinux_2_17``)."""
    out = []
    for tag in tags:
        out.append(tag)
        m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
        if m:
            glibc, arch = int(m.group(1)), m.group(2)
            out += [f"manylinux_2_{g}_{arch}" for g in range(glibc - 1, 4, -1)]
            out += [f"manylinux{alias}_{arch}" for g, alias in ((17, "2014"), (12, "2010"), (5, "1")) if g <= glibc]
    return list(dict.fromkeys(out))


def wheel_python(python, runner):
    if python == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return runner
    found = shutil.which(f"python{python}")
    if not found:
        raise Refused(
            f"--python {python}: no python{python} on PATH (pip evaluates dependency markers for the "
            "interpreter that runs it, so the wheels are downloaded by one of the target's version)"
        )
    return found


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder, meta):
    from packaging.utils import parse_sdist_filename, parse_wheel_filename

    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in MANIFEST)
    hashes = {name: sha256(folder / name) for name in files}
    pins = {}
    for name in files:
        parsed = parse_wheel_filename(name) if name.endswith(".whl") else parse_sdist_filename(name)
        pins.setdefault(f"{parsed[0]}=={parsed[1]}", []).append(hashes[name])
    lock = [f"{pin} " + " ".join(f"--hash=sha256:{h}" for h in hs) for pin, hs in sorted(pins.items())]
    (folder / "requirements.lock").write_text("\n".join(lock) + "\n")
    (folder / "SHA256SUMS").write_text("".join(f"{hashes[n]}  {n}\n" for n in files))
    (folder / "requirements.txt").write_text("\n".join(meta["install"]) + "\n")
    meta.update(files=len(files), bytes=sum((folder / n).stat().st_size for n in files))
    (folder / "wheelhouse.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def replace(old, new):
    """Put ``new`` at ``old``; an old wheelhouse goes, but only the files its own SHA256SUMS lists."""
    if old.exists():
        sums = old / "SHA256SUMS"
        listed = [line.split("  ", 1)[1] for line in sums.read_text().splitlines()] if sums.exists() else []
        for name in [*listed, *MANIFEST]:
            (old / name).unlink(missing_ok=True)
        try:
            old.rmdir()
        except OSError:
            raise Refused(f"{old}: holds files the old wheelhouse did not list; left as it was") from None
    os.replace(new, old)


def download(args, runner, work, partial):
    """Fill ``partial`` for the target; the record's fields."""
    wpy = wheel_python(args.python, runner)
    env = target_environment(args.python)
    reqs = project_requirements(runner, env, args.extras, work)
    fairseq = [r for r in reqs if r.name in FAIRSEQ_NAMES]
    torch_spec = [str(r.specifier) for r in reqs if r.name == "torch"]
    reqs = [r for r in reqs if r.name not in FAIRSEQ_NAMES | DROPPED]
    partial.mkdir()

    # sdists: fairseq (built on the target) and the pure-Python ones without wheels
    pip(runner, "download", "--no-deps", "--no-build-isolation", "--no-binary", ":all:", "-d", partial,
        *map(str, fairseq), *SOURCE_ONLY)  # fmt: skip
    (fairseq_sdist,) = [p for p in partial.iterdir() if p.name.startswith(("fairseq-", "fairseq_"))]
    fairseq_reqs = [r for r in sdist_requirements(fairseq_sdist, env) if r.name not in DROPPED]
    built = work / "built"
    sources = [p for p in partial.iterdir() if p != fairseq_sdist]
    pip(runner, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", built, *sources)
    for wheel in built.iterdir():
        if not wheel.name.endswith("-py3-none-any.whl"):
            raise SystemExit(f"error: {wheel.name}: built a platform wheel from a source-only dependency")
        shutil.copy2(wheel, partial / wheel.name)

    # wheels for the target; torch is the pinned one or a stub that pulls nothing
    stub = work / "stub"
    stub.mkdir()
    torch_version = TORCH_PIN if args.with_torch else stub_torch(stub)
    (work / "constraints.txt").write_text(f"torch=={torch_version}\n")
    install = sorted({str(r) for r in reqs + fairseq_reqs})
    wanted = sorted({*install, *BUILD, *(["torch"] if args.with_torch else [])})
    (work / "wanted.txt").write_text("\n".join(wanted) + "\n")
    platform = [a for p in platform_tags(args.platform) for a in ("--platform", p)]
    pip(wpy, "download", "--only-binary", ":all:", "--python-version", args.python, *platform,
        "-d", partial, "--find-links", partial, "--find-links", stub,
        "-c", work / "constraints.txt", "-r", work / "wanted.txt")  # fmt: skip
    for leftover in partial.glob("torch-*wheelhousestub*"):
        leftover.unlink()
    return {
        "python": args.python,
        "platform": args.platform or "the machine that made it",
        "extras": args.extras,
        "torch": f"torch=={TORCH_PIN}" if args.with_torch else None,
        "project_torch": torch_spec,
        "fairseq": fairseq_sdist.name,
        "build": BUILD,
        "install": install,
    }


def make(args):
    runner = Path(sys.executable)
    try:
        import packaging.requirements  # noqa: F401
        import torch  # noqa: F401  (fairseq's setup.py imports it when pip reads the sdist)
    except ImportError as e:
        raise Refused(f"{runner}: needs {e.name} (run with the project's .venv: PYTHON=.venv/bin/python)") from None
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    # built beside DIR and renamed into place at the end: DIR is whole or as it was
    partial = out.parent / f".{out.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # an interrupted earlier run of this script
    try:
        with tempfile.TemporaryDirectory() as tmp:
            meta = write_manifest(partial, download(args, runner, Path(tmp), partial))
        replace(out, partial)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"wheelhouse {out}: {meta['files']} files, {meta['bytes'] / 1e6:.0f} MB, Python {args.python}, "
          f"platform {meta['platform']}, extras {','.join(args.extras) or '-'}, "
          f"torch {'included' if args.with_torch else 'not included (the target keeps its own)'}")  # fmt: skip


def check(folder):
    """Refuse a folder that is not a complete, unaltered wheelhouse; print its plan as shell assignments."""
    folder = Path(folder).resolve()
    meta_path = folder / "wheelhouse.json"
    if not meta_path.is_file():
        raise Refused(f"{folder}: no wheelhouse.json (make one with scripts/make_wheelhouse.sh)")
    try:
        meta = json.loads(meta_path.read_text())
        listed = [line.split("  ", 1) for line in (folder / "SHA256SUMS").read_text().splitlines()]
    except (OSError, ValueError) as e:
        raise Refused(f"{meta_path}: unreadable wheelhouse record ({e})") from None
    for digest, name in listed:
        path = folder / name
        if not path.is_file():
            raise Refused(f"{path}: listed in SHA256SUMS but missing")
        if sha256(path) != digest:
            raise Refused(f"{path}: sha256 differs from SHA256SUMS")
    plan = {
        "WH_PYTHON": meta["python"],
        "WH_TORCH": meta["torch"] or "",
        "WH_FAIRSEQ": str(folder / meta["fairseq"]),
        "WH_BUILD": " ".join(meta["build"]),
    }
    print("\n".join(f"{k}={shlex.quote(v)}" for k, v in plan.items()))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["check"] and len(argv) == 2:
            check(argv[1])
        elif argv[:1] == ["make"]:
            make(parse_args(argv[1:]))
        else:
            raise Refused("usage: wheelhouse.py make [--python X.Y] [--platform TAG] --out DIR | check DIR")
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
