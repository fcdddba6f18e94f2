"""What gpu_check reads before anything is written: a ``--data`` folder checked and described for
the report; :class:`InputError` (``error: PATH: problem``, exit 2)."""

from pathlib import Path
from typing import Dict


class InputError(Exception):
    """Bad input found before anything is written: ``error: PATH: problem``, exit 2."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")


def check_data(path: Path) -> Dict:
    """The --data folder described for the report; :class:`InputError` unless it is a finished
    ``preprocess.build`` folder of one shard with every file its record lists (checked before anything
    is written)."""
    from preprocess.record import RECORD as BUILD_RECORD
    from preprocess.record import load_record, record_outputs

    usage = "--data takes the --out of python -m preprocess.build"
    if not path.is_dir():
        raise InputError(path, f"{'not a folder' if path.exists() else 'no such folder'}: {usage}")
    record = load_record(path)
    if record is None:
        raise InputError(path, f"no {BUILD_RECORD} of a finished build: {usage}")
    if record.get("shards", 1) != 1:
        raise InputError(path, f"a build of {record.get('shards')} shards: gpu_check reads one (build with --shards 1)")
    missing = [f for f in record_outputs(record) if not (path / f).is_file()]
    if missing:
        raise InputError(path / missing[0], f"listed in {BUILD_RECORD} but missing: an incomplete copy of the build")
    return describe_data(path, record, given=True)


def describe_data(folder: Path, record: Dict, given: bool) -> Dict:
    """What the report says of the data set: where it is, its vocabulary, the text it was built from."""
    pieces = (record.get("sentencepiece") or {}).get("vocab_size") or (record.get("config") or {}).get("vocab_size")
    sources = [
        {"kind": s.get("kind"), "file": Path(str(s.get("path", ""))).name, "sha256": s.get("sha256")}
        for s in record.get("sources") or []
        if isinstance(s, dict)
    ]
    return {
        "folder": str(folder),
        "given": given,  # --data, or built by this run
        "vocab_size": pieces,
        "dictionary": (record.get("fairseq_dictionary") or {}).get("size_with_specials"),
        "sources": sources,
        "train_tokens": ((record.get("splits") or {}).get("train0") or {}).get("tokens"),
    }
