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
- with ``--image FILE`` (``name==version`` lines: what the target machine already has, e.g. the lent
  GPU machine's image, ``scripts/device_image.txt``), none of those: each is a stub of its version
  during resolution, so only what the image lacks is downloaded (``scripts/device_bundle.sh``);
  ``--leave-out NAME`` drops a requirement the target does not need (blingfire, 40 MB);
- never torchaudio (fairseq requires it, text training never imports it, the online set-up removes it);
- with ``--data DIR``, a copy of DIR's files under ``data/``: what the target needs beside the packages
  (the device check's data set, ``scripts/device_bundle.sh``), hashed in ``SHA256SUMS``, never installed;
- ``wheelhouse.json`` (the record: target, extras, the fairseq sdist, build and install lists, and
  ``files``, every file of the folder), ``requirements.txt`` (the requirements, markers evaluated for
  the target: for people), ``requirements.lock`` (every file as ``name==version --hash=sha256:...``:
  what setup_env.sh installs, with ``--require-hashes``) and ``SHA256SUMS``.

The folder is the tool's own (``seed_fairseq.base.fileio``'s ownership rule): a new one is built beside it
and put in place only when complete; an earlier wheelhouse is replaced file by file, exactly the files
its record lists (an entry outside the folder, or through a link, is refused before anything changes),
and a folder holding files its record does not list is refused before anything is downloaded.

With ``--prebuild-python PY`` (the target image's interpreter, or a venv copying it:
``scripts/image_venv.sh``), fairseq's wheel too, built here from the staged sdist by the target's own steps
(:func:`prebuild`: a ``--system-site-packages`` venv over PY, the folder's build lock, then
``env -u CUDA_HOME pip wheel --no-index --require-hashes --no-deps --no-build-isolation`` against PY's
torch and numpy, with no network where ``unshare -n`` is allowed), and recorded in ``wheelhouse.json``
(``fairseq_wheel``: what it was built against, the C libraries' versions its extensions need, how it
was built). The sdist stays: the target installs the wheel only where it fits (``fits``), else builds.

``check DIR [PLAN_DIR]`` (setup_env.sh): refuses a folder with a file that SHA256SUMS does not list (under
``data/`` too), a listed file missing or altered, or a lock that disagrees with SHA256SUMS; writes the lock's lines of
each install step into PLAN_DIR and prints the plan as shell assignments.

``fits DIR`` (setup_env.sh, run with the target venv's own interpreter before fairseq is installed):
exit 0 and ``built against ...`` when the record's wheel fits this interpreter (the same CPython ABI
tag, the same ``torch.__version__``, local label included, the same numpy major, the same platform, a
glibc and libstdc++ at least as new as its extensions need), else exit 1 and why, in one line.
``facts`` prints what that check reads of this interpreter, as JSON.

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
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = "make_wheelhouse.sh"
RECORD = "wheelhouse.json"
# the torch scripts/setup_env.sh pins (the machine's local CPU build)
TORCH_PIN = "2.13.0"
FAIRSEQ_NAMES = {"fairseq", "fairseq-fixed"}
# never installed: fairseq requires it, text training never imports it (see setup.py)
DROPPED = {"torch", "torchaudio"}
# fairseq's build requirements (its pyproject.toml, less torch); setuptools >= 64 also installs
# the project in editable mode without build isolation; numpy pinned as scripts/setup_env.sh pins it.
# The tools are always in the wheelhouse (a known build); cython and numpy are left to an --image that has them.
BUILD_TOOLS = ["setuptools>=64", "wheel"]
BUILD = [*BUILD_TOOLS, "cython", "numpy>=1.21.3,<2.3"]
# pure-Python dependencies with no wheel on PyPI: their sdist is built into a wheel here
SOURCE_ONLY = ["antlr4-python3-runtime==4.9.*"]
MANIFEST = (RECORD, "requirements.txt", "requirements.lock", "SHA256SUMS")
DATA = "data"  # --data's files: hashed in SHA256SUMS like the packages, never installed
# the steps of setup_env.sh --wheelhouse, each a file of the lock's lines (check's PLAN_DIR)
STEPS = ("build", "torch", "install", "fairseq")
# the target's build environment (setup_env.sh --wheelhouse under device_check.sh): what the machine's
# own settings could add to the prebuilt wheel's build is left out
BUILD_ENV_DROPPED = ("CUDA_HOME", "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED",
                     "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")  # fmt: skip
# the versions a compiled extension may need of the C libraries, as ELF version names: (record key, label, pattern)
LIBRARIES = (
    ("glibc", "glibc", rb"GLIBC_(2\.[0-9.]*[0-9])"),
    ("glibcxx", "libstdc++ GLIBCXX", rb"GLIBCXX_(3\.4(?:\.[0-9]+)?)\b"),
    ("cxxabi", "libstdc++ CXXABI", rb"CXXABI_(1\.3(?:\.[0-9]+)?)\b"),
)


class Refused(Exception):
    """Bad input: reported as one ``error:`` line, exit code 2."""


def log(message):
    print(message, flush=True)


def pip(python, *args, quiet=True, env=None, prefix=()):
    cmd = [*map(str, prefix), str(python), "-m", "pip", *(["--quiet"] if quiet else []), *map(str, args)]
    log("+ " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
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
    p.add_argument(
        "--image",
        type=Path,
        default=None,
        help="name==version lines: what the target already has (never downloaded; e.g. scripts/device_image.txt)",
    )
    p.add_argument(
        "--leave-out", action="append", default=[], help="a requirement the target does not need (repeatable)"
    )
    p.add_argument(
        "--download-python",
        default=None,
        help="the interpreter of the target's version that downloads the wheels (default: pythonX.Y on PATH)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help=f"a folder whose files the target needs beside the packages: copied to DIR/{DATA}/ and hashed",
    )
    p.add_argument(
        "--prebuild-python",
        default=None,
        help="the target image's interpreter (or a venv copying it, scripts/image_venv.sh): fairseq's wheel is "
        "built with it as setup_env.sh --wheelhouse would build it there, and recorded beside the sdist",
    )
    args = p.parse_args(argv)
    m = re.fullmatch(r"3\.(\d+)", args.python)
    if not m:
        raise Refused(f"--python {args.python}: expected a version such as 3.11")
    if int(m.group(1)) < 11:
        raise Refused(f"--python {args.python}: the wheelhouse serves fairseq-fixed, which needs Python >= 3.11")
    args.extras = sorted({e.strip() for e in args.extras.split(",") if e.strip()})
    args.image_packages = read_image(args.image) if args.image else {}
    args.leave_out = sorted({canonical(n) for n in args.leave_out})
    args.data_files = data_files(args.data) if args.data else []
    if args.prebuild_python:
        if args.with_torch:
            raise Refused("--prebuild-python: not with --with-torch (the wheel is built against the image's own torch)")
        prebuild_interpreter(args.prebuild_python, args.python)
    return args


def prebuild_interpreter(python, version):
    """The facts of a --prebuild-python (:func:`interpreter_facts`); refused before anything is downloaded
    when it is not a Python ``version`` that imports torch (the wheel is built against its torch)."""
    try:
        got = subprocess.run([python, __file__, "facts"], capture_output=True, text=True, timeout=300)
        facts = json.loads(got.stdout) if got.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise Refused(f"--prebuild-python {python}: cannot be run ({e})") from None
    if not isinstance(facts, dict):
        raise Refused(f"--prebuild-python {python}: cannot be run ({(got.stderr.strip() or 'no output')[-200:]})")
    if facts.get("version") != version:
        raise Refused(f"--prebuild-python {python}: a Python {facts.get('version')}, the target is {version}")
    if facts.get("torch") is None:
        raise Refused(f"--prebuild-python {python}: no torch to build fairseq against ({facts.get('torch_error')})")
    return facts


def data_files(folder):
    """The files of a --data folder, relative and sorted; refused before anything is downloaded: a
    missing or empty folder, a link (what the target gets must be what was checked here)."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        raise Refused(f"{folder}: --data must be a folder (not a link)")
    files = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise Refused(f"{path}: --data holds a link or a special file: only plain files are copied")
        if path.is_file():
            files.append(path.relative_to(folder).as_posix())
    if not files:
        raise Refused(f"{folder}: --data holds no file")
    return files


def canonical(name):
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def read_image(path):
    """{canonical name: version} of an --image file (``name==version`` lines; ``#`` comments)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise Refused(f"{path}: cannot be read ({e})") from None
    image = {}
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
            (spec,) = req.specifier
        except (InvalidRequirement, ValueError):
            raise Refused(f"{path}: line {number}: expected name==version, got {line!r}") from None
        if spec.operator != "==" or "*" in spec.version:
            raise Refused(f"{path}: line {number}: expected name==version, got {line!r}")
        image[canonical(req.name)] = spec.version
    return image


def check_out(out):
    """Refuse, before anything is downloaded, an --out this tool may not replace (``fileio``'s rule): a
    file, a folder of someone else's, a record listing a path outside the folder or through a link, an
    older record that lists no files, or a wheelhouse holding files its record does not list."""
    from seed_fairseq.base.fileio import OutputError, owned_output, staged_files

    try:
        owned = owned_output(out, RECORD, TOOL)
    except OutputError as e:
        raise Refused(str(e)) from None
    if owned is None:
        return
    if not owned.lists_files:
        raise Refused(
            f"{out}: a wheelhouse of an older make_wheelhouse.sh (its record lists no files): "
            "delete it yourself or choose another --out"
        )
    extra = [rel for rel in staged_files(out) if rel not in owned.files]
    if extra:
        raise Refused(
            f"{out}: holds files its record does not list ({', '.join(extra[:5])}"
            f"{' ...' if len(extra) > 5 else ''}): move them away or choose another --out; nothing was changed"
        )


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


STUB = "wheelhousestub"  # the local version label of a stub


def stub_wheel(folder, name, version):
    """A wheel of ``name`` with no files and no dependencies, version ``version+wheelhousestub``: what
    resolution sees instead of a package the target already has (its torch, its image's packages)."""
    version = f"{version}+{STUB}"
    dist = re.sub(r"[-_.]+", "_", name)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
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


def wheel_python(python, runner, given=None):
    if given:
        got = subprocess.run([given, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)  # fmt: skip
        if got.returncode or got.stdout.strip() != python:
            said = got.stdout.strip() or got.stderr[-200:]
            raise Refused(f"--download-python {given}: not a Python {python} ({said})")
        return given
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
    """SHA256SUMS, the lock, requirements.txt, then the record (last: it lists every file)."""
    from packaging.utils import parse_sdist_filename, parse_wheel_filename

    from seed_fairseq.base.fileio import staged_files, write_output_record

    files = [rel for rel in staged_files(folder) if rel not in MANIFEST]
    hashes = {name: sha256(folder / name) for name in files}
    packages = [name for name in files if not name.startswith(f"{DATA}/")]
    pins = {}
    for name in packages:
        parsed = parse_wheel_filename(name) if name.endswith(".whl") else parse_sdist_filename(name)
        pins.setdefault(f"{parsed[0]}=={parsed[1]}", []).append(hashes[name])
    lock = [f"{pin} " + " ".join(f"--hash=sha256:{h}" for h in hs) for pin, hs in sorted(pins.items())]
    (folder / "requirements.lock").write_text("\n".join(lock) + "\n")
    (folder / "SHA256SUMS").write_text("".join(f"{hashes[n]}  {n}\n" for n in files))
    (folder / "requirements.txt").write_text("\n".join(meta["install"]) + "\n")
    meta.update(packages=len(packages), bytes=sum((folder / n).stat().st_size for n in files))
    write_output_record(folder, RECORD, meta)  # adds "files": everything above and the record itself
    return meta


def download(args, runner, work, partial):
    """Fill ``partial`` for the target; the record's fields."""
    wpy = wheel_python(args.python, runner, args.download_python)
    env = target_environment(args.python)
    image = dict(args.image_packages)
    reqs = project_requirements(runner, env, args.extras, work)
    fairseq = [r for r in reqs if r.name in FAIRSEQ_NAMES]
    torch_spec = [str(r.specifier) for r in reqs if r.name == "torch"]
    # the image's packages are the target's: none is downloaded (their stubs stand in below)
    skip = FAIRSEQ_NAMES | DROPPED | set(image) | set(args.leave_out)
    reqs = [r for r in reqs if canonical(r.name) not in skip]

    # sdists: fairseq (built on the target) and the pure-Python ones without wheels
    pip(runner, "download", "--no-deps", "--no-build-isolation", "--no-binary", ":all:", "-d", partial,
        *map(str, fairseq), *SOURCE_ONLY)  # fmt: skip
    (fairseq_sdist,) = [p for p in partial.iterdir() if p.name.startswith(("fairseq-", "fairseq_"))]
    fairseq_reqs = [r for r in sdist_requirements(fairseq_sdist, env) if canonical(r.name) not in skip]
    built = work / "built"
    sources = [p for p in partial.iterdir() if p != fairseq_sdist and p.name.endswith((".tar.gz", ".zip"))]
    pip(runner, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", built, *sources)
    for wheel in built.iterdir():
        if not wheel.name.endswith("-py3-none-any.whl"):
            raise SystemExit(f"error: {wheel.name}: built a platform wheel from a source-only dependency")
        shutil.copy2(wheel, partial / wheel.name)

    # wheels for the target; torch is the pinned one or a stub that pulls nothing, and every package
    # of the image a stub of its version (a requirement it does not satisfy fails the resolution here)
    stub = work / "stub"
    stub.mkdir()
    from packaging.requirements import Requirement

    tools = {canonical(Requirement(b).name) for b in BUILD_TOOLS}
    if not args.with_torch:
        image.setdefault("torch", TORCH_PIN)
    pins = {name: stub_wheel(stub, name, version) for name, version in image.items() if name not in tools}
    if args.with_torch:
        pins["torch"] = TORCH_PIN
    (work / "constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    build = [b for b in BUILD if b in BUILD_TOOLS or canonical(Requirement(b).name) not in args.image_packages]
    install = sorted({str(r) for r in reqs + fairseq_reqs})
    wanted = sorted({*install, *build, *(["torch"] if args.with_torch else [])})
    (work / "wanted.txt").write_text("\n".join(wanted) + "\n")
    platform = [a for p in platform_tags(args.platform) for a in ("--platform", p)]
    pip(wpy, "download", "--only-binary", ":all:", "--python-version", args.python, *platform,
        "-d", partial, "--find-links", partial, "--find-links", stub,
        "-c", work / "constraints.txt", "-r", work / "wanted.txt")  # fmt: skip
    for leftover in partial.glob(f"*+{STUB}-*"):
        leftover.unlink()
    return {
        "python": args.python,
        "platform": args.platform or "the machine that made it",
        "extras": args.extras,
        "torch": f"torch=={TORCH_PIN}" if args.with_torch else None,
        "project_torch": torch_spec,
        "fairseq": fairseq_sdist.name,
        "build": build,
        "install": install,
        "image": {"file": str(args.image), "packages": len(args.image_packages)} if args.image else None,
        "left_out": args.leave_out,
    }


def make(args):
    runner = Path(sys.executable)
    try:
        import packaging.requirements  # noqa: F401
        import torch  # noqa: F401  (fairseq's setup.py imports it when pip reads the sdist)
    except ImportError as e:
        raise Refused(f"{runner}: needs {e.name} (run with the project's .venv: PYTHON=.venv/bin/python)") from None
    from seed_fairseq.base.fileio import OutputError, staged_output

    out = args.out.absolute()
    check_out(out)  # before any download: a folder this tool may not replace is refused as it is
    # built in a staging folder beside DIR and installed only when complete (fileio.staged_output):
    # DIR is whole, or as it was
    try:
        with staged_output(out, RECORD, TOOL, replace=True) as partial, tempfile.TemporaryDirectory() as tmp:
            meta = download(args, runner, Path(tmp), partial)
            meta["data"] = copy_data(args, partial) if args.data else None
            meta["fairseq_wheel"] = None
            meta = write_manifest(partial, meta)
            if args.prebuild_python:
                # built from the folder as it is (its lock, its sdist), then hashed and listed with the rest
                meta["fairseq_wheel"] = prebuild(args.prebuild_python, partial, Path(tmp))
                meta = write_manifest(partial, meta)
    except OutputError as e:
        raise Refused(str(e)) from None
    print(f"wheelhouse {out}: {meta['packages']} files, {meta['bytes'] / 1e6:.1f} MB, Python {args.python}, "
          f"platform {meta['platform']}, extras {','.join(args.extras) or '-'}, "
          f"torch {'included' if args.with_torch else 'not included (the target keeps its own)'}")  # fmt: skip
    wheel = meta["fairseq_wheel"]
    if wheel:
        print(f"fairseq: {wheel['file']} ({(out / wheel['file']).stat().st_size / 1e6:.1f} MB) built in "
              f"{wheel['built_with']['seconds']} s, {built_against(wheel)}; the target installs it where it fits, "
              "else builds the sdist")  # fmt: skip


def build_environment():
    """The environment of the target's fairseq build (setup_env.sh --wheelhouse under device_check.sh): no
    index, no pip configuration or cache, no CUDA_HOME (fairseq compiles no CUDA kernels then), MAX_JOBS
    the cores, none of this machine's compiler settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in BUILD_ENV_DROPPED}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               MAX_JOBS=str(os.cpu_count() or 1))  # fmt: skip
    return env


def no_network():
    """``unshare -n`` (a network namespace with no interface) where this user may make one, else nothing:
    then only --no-index keeps the build offline."""
    if shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", "-n"]
    return []


def prebuild(image_python, partial, work):
    """fairseq's wheel, built from ``partial``'s sdist the way ``setup_env.sh --wheelhouse
    --system-site-packages`` builds it on the target, with ``image_python`` as the target's interpreter: a
    venv that sees its packages (a .pth naming its site folders, as setup_env.sh writes one), the folder's
    build lock installed into it, then the fairseq step's command with ``pip wheel`` for ``pip install``
    (the same PEP 517 build, its wheel kept), against the image's torch and numpy. The record's entry."""
    env, offline = build_environment(), no_network()
    # pip's build folder inside ``work``: removed with it, also when a signal stops the build
    (work / "prebuild-tmp").mkdir()
    env["TMPDIR"] = str(work / "prebuild-tmp")

    def output(*cmd):
        got = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
        if got.returncode:
            raise SystemExit(f"error: {' '.join(map(str, cmd[:4]))} ... failed: {got.stderr.strip()[-300:]}")
        return got.stdout

    venv = work / "prebuild-venv"
    log(f"+ {image_python} -m venv --system-site-packages {venv}")
    try:
        output(image_python, "-m", "venv", "--system-site-packages", venv)
    except SystemExit:  # no ensurepip: the venv runs the image's pip through the .pth, as setup_env.sh does
        shutil.rmtree(venv, ignore_errors=True)
        output(image_python, "-m", "venv", "--system-site-packages", "--without-pip", venv)
    vpy = venv / "bin" / "python"
    sites = output(image_python, "-c", "import site; print('\\n'.join(site.getsitepackages()))")
    Path(output(vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip(),
         "_seed_fairseq_base_site.pth").write_text(sites)  # fmt: skip
    plan_dir = work / "prebuild-plan"
    plan_dir.mkdir()
    from seed_fairseq.base.fileio import STAGING_MARK

    steps = plan(partial, plan_dir, ignore={STAGING_MARK})
    install = ["install", "--no-index", "--find-links", partial, "--require-hashes", "--no-deps"]
    pip(vpy, *install, "--only-binary", ":all:", "-r", steps["WH_LOCK_BUILD"], env=env, prefix=offline)
    facts = json.loads(output(vpy, __file__, "facts"))
    pin = work / "prebuild-torch-constraint.txt"
    pin.write_text(f"torch=={facts['torch']}\n")
    built = work / "prebuilt"
    start = time.monotonic()
    pip(vpy, "wheel", "--no-index", "--find-links", partial, "--require-hashes", "--no-deps", "-c", pin,
        "--no-build-isolation", "--no-binary", ":all:", "-w", built, "-r", steps["WH_LOCK_FAIRSEQ"],
        env=env, prefix=offline)  # fmt: skip
    seconds = round(time.monotonic() - start)
    (wheel,) = built.glob("*.whl")
    tags = wheel.name[: -len(".whl")].split("-")[-3:]  # python, abi, platform
    against = {"python": facts["python"], "abi": facts["abi"], "platform": facts["platform"]}
    if tags != [against["python"], against["abi"], against["platform"]]:
        raise SystemExit(f"error: {wheel.name}: tagged {'-'.join(tags)}, built by {'-'.join(against.values())}")
    shutil.copy2(wheel, Path(partial) / wheel.name)
    compiler = output("sh", "-c", "c++ --version | head -1").strip()
    return {
        "file": wheel.name,
        "sdist": Path(steps["WH_FAIRSEQ"]).name,
        "built_against": {
            **against,
            "torch": facts["torch"],
            "torch_cxx11_abi": facts["torch_cxx11_abi"],
            "numpy": facts["numpy"],
        },
        "needs": wheel_needs(wheel),
        "built_with": {
            "image_python": str(image_python),
            "interpreter": facts["interpreter"],
            "cython": facts["cython"],
            "setuptools": facts["setuptools"],
            "wheel": facts["wheel"],
            "compiler": compiler,
            "glibc": facts["glibc"],
            "seconds": seconds,
            "jobs": env["MAX_JOBS"],
            "network": "none (unshare -n)" if offline else "up, unused (--no-index)",
            "steps": "setup_env.sh --wheelhouse's: a --system-site-packages venv over the image's python, the "
            "build lock, then env -u CUDA_HOME pip wheel --no-index --require-hashes --no-deps "
            "--no-build-isolation --no-binary :all: -r <the fairseq lock>",
        },
    }


def _version(text):
    return tuple(int(x) for x in text.split("."))


def _highest(data, pattern):
    found = {m.decode() for m in re.findall(pattern, data)}
    return max(found, key=_version) if found else None


def wheel_needs(wheel):
    """The newest glibc, GLIBCXX and CXXABI versions any compiled file of ``wheel`` names (the ELF version
    names it needs; a name found elsewhere in the file can only make this stricter)."""
    needs = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if ".so" not in name.rsplit("/", 1)[-1]:
                continue
            data = z.read(name)
            for key, _, pattern in LIBRARIES:
                found = _highest(data, pattern)
                if found and (key not in needs or _version(found) > _version(needs[key])):
                    needs[key] = found
    return needs


def interpreter_facts():
    """What a wheel with compiled extensions depends on, of this interpreter and its process: its CPython
    ABI tag, platform, torch (``__version__``, local label included, and its C++ ABI), numpy, and the glibc
    and libstdc++ it runs with (the libstdc++ torch loaded). Also the build tools' versions, for a record."""
    import importlib.metadata
    import platform
    import sysconfig

    version = "%d.%d" % sys.version_info[:2]
    cpython = sys.implementation.name == "cpython"
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}" if cpython else f"{sys.implementation.name}{version}"
    facts = {
        "version": version,
        "interpreter": platform.python_version(),
        "python": tag,
        "abi": tag + (getattr(sys, "abiflags", "") if cpython else ""),
        "platform": re.sub(r"[-.]", "_", sysconfig.get_platform()),
        "torch": None,
        "torch_error": None,
        "torch_cxx11_abi": None,
        "numpy": None,
    }
    try:
        facts["glibc"] = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
    except (ValueError, OSError, AttributeError, IndexError):
        facts["glibc"] = None
    try:
        import torch

        facts["torch"] = str(torch.__version__)
        facts["torch_cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    except Exception as e:  # noqa: BLE001 (any failure to import it is the fact)
        facts["torch_error"] = f"{type(e).__name__}: {e}"[:200]
    try:
        import numpy

        facts["numpy"] = numpy.__version__
    except Exception:  # noqa: BLE001
        pass
    facts["glibcxx"] = facts["cxxabi"] = None
    libstdcxx = _loaded_libstdcxx()
    if libstdcxx:
        data = Path(libstdcxx).read_bytes()
        facts["glibcxx"], facts["cxxabi"] = (_highest(data, pattern) for key, _, pattern in LIBRARIES[1:])
    for name in ("cython", "setuptools", "wheel"):
        try:
            facts[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            facts[name] = None
    return facts


def _loaded_libstdcxx():
    """The libstdc++ this process runs with (torch loaded it; else the one the loader finds)."""

    def mapped():
        try:
            for line in Path("/proc/self/maps").read_text().splitlines():
                fields = line.split(None, 5)  # address, perms, offset, device, inode[, path]
                if len(fields) == 6 and "/libstdc++.so" in fields[5]:
                    return fields[5].strip()
        except OSError:
            pass
        return None

    if not mapped():
        try:
            import ctypes

            ctypes.CDLL("libstdc++.so.6")
        except OSError:
            return None
    return mapped()


def built_against(wheel):
    b = wheel["built_against"]
    return f"built against torch {b['torch']}, numpy {b['numpy']}, {b['abi']}, {b['platform']}"


def fit_problems(wheel, facts):
    """Why the recorded prebuilt ``wheel`` does not fit the interpreter of ``facts``; empty when it does."""
    b, problems = wheel["built_against"], []
    if (facts.get("python"), facts.get("abi")) != (b["python"], b["abi"]):
        problems.append(f"Python {facts.get('abi')} here, the wheel is {b['abi']}")
    if facts.get("platform") != b["platform"]:
        problems.append(f"platform {facts.get('platform')} here, the wheel is {b['platform']}")
    if facts.get("torch") is None:
        problems.append(f"no torch here ({facts.get('torch_error')})")
    elif facts["torch"] != b["torch"]:
        problems.append(f"torch {facts['torch']} here, the wheel was built against torch {b['torch']}")
    elif facts.get("torch_cxx11_abi") != b["torch_cxx11_abi"]:
        abi = (facts.get("torch_cxx11_abi"), b["torch_cxx11_abi"])
        problems.append(f"torch's C++11 ABI is {abi[0]} here, {abi[1]} in the wheel's build")
    have, built = (facts.get("numpy") or "none").split(".")[0], b["numpy"].split(".")[0]
    if have != built:
        problems.append(f"numpy {facts.get('numpy')} here, the wheel was built against numpy {b['numpy']} (major "
                        f"{have} vs {built})")  # fmt: skip
    for key, label, _ in LIBRARIES:
        need, have = wheel.get("needs", {}).get(key), facts.get(key)
        if need and (have is None or _version(have) < _version(need)):
            problems.append(f"{label} {have or 'not found'} here, the wheel needs {need}")
    return problems


def fits(folder):
    """Exit 0 and print what the wheel was built against when the record's prebuilt fairseq wheel fits this
    interpreter; else exit 1 and print why, in one line (setup_env.sh then builds the sdist)."""
    try:
        wheel = json.loads((Path(folder) / RECORD).read_text()).get("fairseq_wheel")
        if not wheel:
            print("the bundle has no prebuilt wheel")
            return 1
        problems = fit_problems(wheel, interpreter_facts())
        text = built_against(wheel)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"its record cannot be read ({type(e).__name__}: {e})")
        return 1
    print("; ".join(problems) if problems else text)
    return 1 if problems else 0


def copy_data(args, partial):
    """--data's files (listed before the download) into ``partial/data``; the record's ``data`` field."""
    target = Path(partial) / DATA
    for rel in args.data_files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(args.data / rel, target / rel)
    size = sum((target / rel).stat().st_size for rel in args.data_files)
    return {"from": str(args.data.absolute()), "folder": DATA, "files": len(args.data_files), "bytes": size}


def _normal(name):
    """PEP 503's normalised name (packaging.utils.canonicalize_name)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name_version(filename):
    """(normalised name, version) of a wheel (``name-version-...whl``) or sdist (``name-version.tar.gz``)
    file name, as the lock writes them (packaging's parse_*_filename, for this folder's own names)."""
    if filename.endswith(".whl"):
        name, version = filename.split("-")[:2]
    else:
        stem = re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", filename)
        name, _, version = stem.rpartition("-")
    return _normal(name), version


def check(folder, plan_dir=None):
    """Refuse a folder that is not a complete, unaltered wheelhouse; print its plan as shell assignments."""
    print("\n".join(f"{k}={shlex.quote(v)}" for k, v in plan(folder, plan_dir).items()))


def plan(folder, plan_dir=None, ignore=()):
    """Refuse a folder that is not a complete, unaltered wheelhouse; its plan (the ``WH_*`` values).

    Every file must be listed in SHA256SUMS with its digest (an unlisted file is refused: pip could
    prefer it), and the lock must pin exactly those digests.  With ``plan_dir``, the lock's lines of
    each install step (:data:`STEPS`) are written there, for ``pip install --require-hashes -r``.
    A prebuilt fairseq wheel the record names must be one of those files, of the sdist's name and version.
    ``ignore``: names at the top that are not the wheelhouse's (a staging folder's mark, :func:`prebuild`).
    The standard library only: it runs with the target's bare ``python3``."""

    folder = Path(folder).resolve()
    meta_path = folder / RECORD
    if not meta_path.is_file():
        raise Refused(f"{folder}: no wheelhouse.json (make one with scripts/make_wheelhouse.sh)")
    try:
        meta = json.loads(meta_path.read_text())
        listed = dict(reversed(line.split("  ", 1)) for line in (folder / "SHA256SUMS").read_text().splitlines())
        lock = [line.split() for line in (folder / "requirements.lock").read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise Refused(f"{meta_path}: unreadable wheelhouse record ({e})") from None
    for name, digest in listed.items():
        path = folder / name
        # a package at the top; the data's files under data/, never through a link
        inside = "/" not in name or (name.startswith(f"{DATA}/") and path.resolve() == folder / name)
        if not inside or name in MANIFEST or not path.is_file() or path.is_symlink():
            raise Refused(f"{path}: listed in SHA256SUMS but missing")
        if sha256(path) != digest:
            raise Refused(f"{path}: sha256 differs from SHA256SUMS")
    for entry in sorted(folder.iterdir()):
        if entry.name == DATA and entry.is_dir() and not entry.is_symlink():
            for path in sorted(entry.rglob("*")):
                if (path.is_symlink() or not path.is_dir()) and path.relative_to(folder).as_posix() not in listed:
                    raise Refused(f"{path}: not listed in SHA256SUMS: the bundle's data is what was checked")
        elif entry.name not in MANIFEST and entry.name not in listed and entry.name not in ignore:
            raise Refused(f"{entry}: not listed in SHA256SUMS: only the wheelhouse's own files may be installed")
    listed = {name: digest for name, digest in listed.items() if "/" not in name}  # the packages
    pinned = {}
    for fields in lock:
        pin, hashes = fields[0], {h.split(":", 1)[-1] for h in fields[1:] if h.startswith("--hash=")}
        pinned[_normal(pin.split("==", 1)[0])] = (fields, hashes)
    digests = set()
    for name, digest in listed.items():
        parsed = _name_version(name)
        fields, hashes = pinned.get(parsed[0], (None, set()))
        if fields is None or fields[0] != f"{parsed[0]}=={parsed[1]}" or digest not in hashes:
            raise Refused(f"{folder / 'requirements.lock'}: does not pin {name} with its SHA256SUMS digest")
        digests.add(digest)
    for fields, hashes in pinned.values():
        if not hashes or not hashes <= digests:
            raise Refused(f"{folder / 'requirements.lock'}: {fields[0]} has a hash of no listed file")
    fairseq = _name_version(meta["fairseq"])[0]
    wheel = (meta.get("fairseq_wheel") or {}).get("file", "")
    if wheel and (wheel not in listed or not wheel.endswith(".whl")
                  or _name_version(wheel) != _name_version(meta["fairseq"])):  # fmt: skip
        raise Refused(f"{meta_path}: names a fairseq wheel {wheel} that is not the listed wheel of {meta['fairseq']}")
    build = {_normal(re.split(r"[<>=!~;\[ ]", b, maxsplit=1)[0]) for b in meta["build"]}
    step_of = {}
    for name in pinned:
        step_of[name] = "fairseq" if name == fairseq else "torch" if name == "torch" else (
            "build" if name in build else "install")  # fmt: skip
    plan = {
        "WH_PYTHON": meta["python"],
        "WH_TORCH": meta["torch"] or "",
        "WH_FAIRSEQ": str(folder / meta["fairseq"]),
        "WH_FAIRSEQ_WHEEL": str(folder / wheel) if wheel else "",
        "WH_BUILD": " ".join(meta["build"]),
    }
    if plan_dir is not None:
        plan_dir = Path(plan_dir)
        for step in STEPS:
            lines = [" ".join(fields) for name, (fields, _) in sorted(pinned.items()) if step_of[name] == step]
            path = plan_dir / f"{step}.lock"
            path.write_text("".join(f"{line}\n" for line in lines))
            plan[f"WH_LOCK_{step.upper()}"] = str(path)
    return plan


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["check"] and len(argv) in (2, 3):
            check(*argv[1:])
        elif argv[:1] == ["make"]:
            make(parse_args(argv[1:]))
        elif argv[:1] == ["fits"] and len(argv) == 2:
            return fits(argv[1])
        elif argv == ["facts"]:
            print(json.dumps(interpreter_facts(), indent=1, sort_keys=True))
        else:
            raise Refused(
                "usage: wheelhouse.py make [--python X.Y] [--platform TAG] --out DIR | check DIR [PLAN_DIR] | fits DIR"
                " | facts"
            )
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
