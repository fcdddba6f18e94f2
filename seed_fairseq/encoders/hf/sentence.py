"""What a sentence-transformers folder computes on top of its encoder: the model's representation.

A sentence-transformers model is its encoder followed by modules (``modules.json``): a
``Pooling`` module that turns the token vectors into one vector (``1_Pooling/config.json``:
cls, mean, max, mean_sqrt_len_tokens, lasttoken, weightedmean, or several concatenated),
optionally a ``Normalize`` module (unit vectors), and a similarity
(``config_sentence_transformers.json``'s ``similarity_fn_name``).  That is the vector a user
of the model ranks with; the plugin pre-trains, validates and scores the same one
(``--bottleneck-pooling``, ``--retrieval-similarity``: ``models/bottleneck.py``).

:func:`read_folder` reads it for the import, refusing (:class:`HFFolderError`, ``FILE:
problem``) what the plugin cannot reproduce exactly; :func:`declared_similarity` is the
rule the import and the retrieval tools share:

* a model that normalises (a ``Normalize`` module) compares by cosine: on unit vectors the
  dot product is the cosine, whatever ``similarity_fn_name`` says;
* a folder this project wrote (its export or fine-tuning record beside it) compares as that
  record says; one written before the record said it (0.2.0 before issue 33, and 0.1's export,
  which kept no record but its model card) was [CLS] and the dot product, although
  sentence-transformers wrote ``"similarity_fn_name": "cosine"`` (its default) into every folder
  it saved;
* otherwise ``similarity_fn_name`` (``cosine`` or ``dot``), else the dot product.

A folder without ``modules.json`` (a plain HuggingFace encoder, BERT as released) has no
representation of its own: it gets the papers' [CLS] vector and dot product.
"""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...base.representation import PAPERS, SIMILARITIES, ST_POOLING, Representation
from .folder import HFFolderError

MODULES = "modules.json"
ST_CONFIG = "config_sentence_transformers.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
# the Transformer module's configuration under every name sentence-transformers reads (3.x - 6.x,
# ``Transformer.load_config``): the first one present is the module's
TRANSFORMER_CONFIGS = (TRANSFORMER_CONFIG, "sentence_roberta_config.json", "sentence_distilbert_config.json",
                       "sentence_camembert_config.json", "sentence_albert_config.json",
                       "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")  # fmt: skip
TOKENIZER_CONFIG = "tokenizer_config.json"
# the module classes a folder may name: sentence-transformers' own (3.x: sentence_transformers.models.X,
# 6.x: sentence_transformers.sentence_transformer.modules.X, ...); any other class is code from
# elsewhere, which sentence-transformers < 6 imports and runs when it loads the folder
ST_PACKAGE = "sentence_transformers."
# The records this project's tools write beside the model files, with the tools they name: the
# export's (hf/export.py EXPORT_RECORD) and fine-tuning's (retrieval/training.py RECORD, TOOL)
TOOL_RECORDS = {
    "seed_fairseq_export.json": ("seed_fairseq.hf.export",),
    "finetune.json": ("examples/retrieval/finetune.py",),
}

# sentence-transformers' pooling modes -> the plugin's (base/representation.py)
ST_TO_PLUGIN = {st: plugin for plugin, st in ST_POOLING.items()}
# the legacy spelling of 1_Pooling/config.json (sentence-transformers < 5), in its concatenation order
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# similarity_fn_name spellings -> the plugin's, matched without case: the values of sentence-transformers'
# SimilarityFunction ("cosine", "dot"), its member names (COSINE, DOT_PRODUCT, DOT) and its util functions
# (cos_sim, dot_score).  sentence-transformers 6 takes only "cosine", "dot", "euclidean" and "manhattan" and
# compares a folder naming anything else by cosine, its default; 3.x - 5.x refuse such a folder.  A
# name is taken for what it says here (docs/hf.md), and the export writes it back as "cosine" or "dot".
SIMILARITY_NAMES = {"dot": "dot", "dot_product": "dot", "dot_score": "dot", "cosine": "cosine", "cos_sim": "cosine"}
# the distances sentence-transformers has: refused (the tools rank by inner product)
DISTANCES = ("euclidean", "manhattan")




def st_modules() -> Tuple[type, type, type]:
    """sentence-transformers' ``Transformer``, ``Pooling`` and ``Normalize`` classes."""
    try:  # sentence-transformers >= 6; importing sentence_transformers.models warns there
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:  # 3.x - 5.x
        from sentence_transformers.models import Normalize, Pooling, Transformer
    return Transformer, Pooling, Normalize


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HFFolderError(path, f"not JSON ({e})") from None


def _object(path: Path) -> Dict[str, Any]:
    """A JSON object file; {} when it is missing."""
    if not path.is_file():
        return {}
    value = _json(path)
    if not isinstance(value, dict):
        raise HFFolderError(path, f"not a JSON object but a {type(value).__name__}")
    return value


def module_list(folder) -> Optional[List[Tuple[str, str]]]:
    """``[(kind, path)]`` of ``modules.json`` (kind: the class name, ``Pooling``), None without one.

    Vetted before sentence-transformers reads it (:class:`HFFolderError` naming ``modules.json``):
    every module is one of sentence-transformers' own classes (another is code from elsewhere, run
    by sentence-transformers < 6 when it loads the folder), and its folder lies inside the model's
    (no absolute path, no ``..``, no link out of it: sentence-transformers reads it first)."""
    folder = Path(folder)
    path = folder / MODULES
    if not path.is_file():
        return None
    spec = _json(path)
    if not isinstance(spec, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in spec):
        raise HFFolderError(path, "not a list of sentence-transformers modules (each with a 'type')")
    modules = []
    for m in spec:
        kind, where = m["type"], m.get("path", "")
        if not kind.startswith(ST_PACKAGE):
            raise HFFolderError(
                path,
                f"module type {kind!r} is not one of sentence-transformers' own classes: loading it would run code "
                "from elsewhere (sentence-transformers 6 refuses it without trust_remote_code)",
            )
        if not isinstance(where, str):
            raise HFFolderError(path, f"module {kind.rsplit('.', 1)[-1]}: its path must be a string, got {where!r}")
        inside, target = folder.resolve(), (folder / where).resolve()
        if where and (Path(where).is_absolute() or ".." in Path(where).parts or
                      (target != inside and inside not in target.parents)):  # fmt: skip
            raise HFFolderError(path, f"module {kind.rsplit('.', 1)[-1]}: path {where!r} leads out of the model folder")
        modules.append((kind.rsplit(".", 1)[-1], where))
    return modules


def st_pooling_modes(config_path: Path) -> List[str]:
    """The pooling modes a ``Pooling`` module's config.json names (sentence-transformers' names;
    several are concatenated), in either spelling (``pooling_mode``, or the legacy booleans)."""
    cfg = _object(config_path)
    if not cfg:
        raise HFFolderError(config_path, "not found: the Pooling module's configuration")
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = [m for key, m in LEGACY_POOLING_KEYS.items() if cfg.get(key)]
        return modes or ["mean"]  # sentence-transformers' default
    modes = [mode] if isinstance(mode, str) else mode
    if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
        raise HFFolderError(config_path, f"pooling_mode must be a name or a list of names, got {mode!r}")
    return modes


def _is_tool_record(name: str, record: Any) -> bool:
    if not isinstance(record, dict):
        return False
    if record.get("tool") in TOOL_RECORDS[name]:
        return True
    # fine-tuning records written before they named their tool (retrieval/training.is_finetune_record)
    return name == "finetune.json" and {"config", "steps", "train_queries"} <= record.keys()


# 0.1's export kept no record; its model card (README.md) opened with these lines and told users to
# rank by the [CLS] vector's dot product, while sentence-transformers wrote its default "cosine" beside it
EXPORT_0_1_CARD = ("tags: [seed-encoder, dense-retrieval, fairseq, sentence-transformers]",
                   "# SEED-Encoder (exported from fairseq)")  # fmt: skip


def is_export_0_1(folder) -> bool:
    """Is ``folder`` a model 0.1's export wrote (its model card, no export record)?"""
    try:
        head = (Path(folder) / "README.md").read_text(encoding="utf-8")[:2000].splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    return all(line in head for line in EXPORT_0_1_CARD)


def record_similarity(folder) -> Optional[str]:
    """The similarity a record of this project's tools in ``folder`` states: its ``similarity``,
    ``dot`` for one written before records stated it, and for a folder 0.1's export wrote
    (:func:`is_export_0_1`); None without such a record."""
    if is_export_0_1(folder) and not (Path(folder) / "seed_fairseq_export.json").is_file():
        return "dot"
    for name in TOOL_RECORDS:
        path = Path(folder) / name
        try:
            record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, UnicodeDecodeError, ValueError):
            record = None  # not this project's record: the model's own files decide
        if _is_tool_record(name, record) and record.get("similarity", "dot") in SIMILARITIES:
            return record.get("similarity", "dot")
    return None


def similarity_name(folder) -> Optional[str]:
    """``config_sentence_transformers.json``'s ``similarity_fn_name`` as the plugin's ``cosine`` or
    ``dot`` (:data:`SIMILARITY_NAMES`), None when it names none; :class:`HFFolderError` naming the
    file for a distance (euclidean, manhattan: the tools rank by inner product) or a value that is
    no similarity's name."""
    path = Path(folder) / ST_CONFIG
    name = _object(path).get("similarity_fn_name")
    if name is None:
        return None
    key = name.lower() if isinstance(name, str) else None
    if key in DISTANCES:
        raise HFFolderError(
            path,
            f"similarity_fn_name {name!r}: the tools rank by inner product, so by dot product or cosine (a model "
            "that normalises its vectors), not by a distance",
        )
    if key not in SIMILARITY_NAMES:
        raise HFFolderError(
            path, f"similarity_fn_name {name!r} is not a similarity's name (cosine or dot; euclidean, manhattan)"
        )
    return SIMILARITY_NAMES[key]


def declared_similarity(folder, normalizes: bool) -> str:
    """``cosine`` or ``dot``: how the model in ``folder`` compares its vectors (the module's rule);
    :class:`HFFolderError` naming ``config_sentence_transformers.json`` for a similarity the
    tools cannot search by (:func:`similarity_name`)."""
    declared = similarity_name(folder)  # checked whatever decides: a bad file is refused alike
    if normalizes:
        return "cosine"
    recorded = record_similarity(folder)
    if recorded is not None:
        return recorded
    return declared or "dot"


def transformer_config(folder) -> Tuple[Path, Dict[str, Any]]:
    """(path, content) of the Transformer module's configuration: the first of
    :data:`TRANSFORMER_CONFIGS` present, as sentence-transformers reads it ({} without one)."""
    folder = Path(folder)
    for name in TRANSFORMER_CONFIGS:
        if (folder / name).is_file():
            return folder / name, _object(folder / name)
    return folder / TRANSFORMER_CONFIG, {}


def _length(value: Any, path: Path, key: str) -> Optional[int]:
    """A text length a file states: None when absent, else a whole number >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HFFolderError(path, f"{key} {value!r} is not a whole number >= 1")
    return value


def text_cut(folder) -> int:
    """The longest text, in tokens, sentence-transformers encodes with the model in ``folder`` (its
    ``max_seq_length``; 0 when nothing limits it), read wherever sentence-transformers keeps it:

    * 3.x - 5.x write it as ``max_seq_length`` in ``sentence_bert_config.json`` (or a legacy
      ``sentence_<family>_config.json``);
    * 6.x write it as the tokenizer's ``model_max_length`` (``tokenizer_config.json``) and leave it out
      of that file;
    * without either, both take the tokenizer's ``model_max_length`` capped at the model's
      ``max_position_embeddings`` (a plain HuggingFace folder too).

    A folder whose module configuration sets both ``max_seq_length`` and a different
    ``model_max_length`` for the tokenizer is cut differently by 3.x - 5.x (the first) and 6.x (the
    second): refused, :class:`HFFolderError` naming the file.  The import checks the result against
    the installed sentence-transformers' own reading (``import_check.compare_representation``)."""
    folder = Path(folder)
    path, module = transformer_config(folder)
    given = _length(module.get("max_seq_length"), path, "max_seq_length")
    kwargs = module.get("processor_kwargs", module.get("tokenizer_args")) or {}
    tokenizer_arg = _length(kwargs.get("model_max_length"), path, "model_max_length") if isinstance(kwargs, dict) \
        else None  # fmt: skip
    if given is not None and tokenizer_arg is not None and given != tokenizer_arg:
        raise HFFolderError(
            path,
            f"max_seq_length {given} and the tokenizer's model_max_length {tokenizer_arg}: sentence-transformers "
            "before 6 cuts texts at the first, 6 at the second; set one",
        )
    if given is not None or tokenizer_arg is not None:
        return given or tokenizer_arg
    tokenizer = _object(folder / TOKENIZER_CONFIG).get("model_max_length")
    positions = _object(folder / "config.json").get("max_position_embeddings")
    limits = [v for v in (tokenizer, positions) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return min(limits) if limits else 0


def read_folder(folder) -> Representation:
    """The representation a model folder declares, for the import: the papers' [CLS] and dot
    product without ``modules.json``; with it exactly Transformer (the folder itself), Pooling of
    one mode the plugin has, and optionally Normalize; in both, the text cut sentence-transformers
    applies (:func:`text_cut`).  :class:`HFFolderError` (``FILE: problem``) for what the import
    cannot carry or sentence-transformers would refuse: another module (Dense, LayerNorm, ...) or
    one from elsewhere, a module path out of the folder, a pooling it cannot reproduce
    (weightedmean, several concatenated), lower-casing done by sentence-transformers rather than by
    the tokenizer, a default prompt, embeddings truncated to fewer dimensions, a distance as
    similarity or a similarity that names none."""
    folder = Path(folder)
    modules = module_list(folder)
    if modules is None:
        return replace(PAPERS, max_length=text_cut(folder))
    spec = folder / MODULES
    kinds = [k for k, _ in modules]
    others = [f"{k} ({p or '.'})" for k, p in modules if k not in ("Transformer", "Pooling", "Normalize")]
    if others:
        raise HFFolderError(
            spec,
            f"module {others[0]} changes the vector after pooling and the import cannot carry it into fairseq "
            "(supported: Transformer, Pooling, Normalize)",
        )
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise HFFolderError(
            spec, f"modules {' -> '.join(kinds) or 'none'}: the import needs Transformer -> Pooling [-> Normalize]"
        )
    if modules[0][1] not in ("", "."):
        raise HFFolderError(
            spec, f"the Transformer module is in {modules[0][1]!r}: import that folder's encoder (the import reads "
            "the encoder from the folder itself)",
        )  # fmt: skip
    config_path, transformer = transformer_config(folder)
    if transformer.get("do_lower_case"):
        raise HFFolderError(
            config_path,
            "do_lower_case is true: sentence-transformers lower-cases every text before its tokenizer, and the "
            "import carries only what the tokenizer does",
        )
    max_length = text_cut(folder)
    pooling_path = folder / modules[1][1] / "config.json"
    modes = st_pooling_modes(pooling_path)
    if len(modes) != 1 or modes[0] not in ST_TO_PLUGIN:
        raise HFFolderError(
            pooling_path,
            f"pooling {' + '.join(modes)}: the plugin pools by one of {', '.join(ST_TO_PLUGIN)} "
            "(models/bottleneck.py), so pre-training could not train this vector",
        )
    st_path = folder / ST_CONFIG
    st_config = _object(st_path)
    if st_config.get("default_prompt_name") is not None:
        raise HFFolderError(
            st_path,
            f"default_prompt_name {st_config['default_prompt_name']!r}: sentence-transformers puts a prompt before "
            "every text (and refuses a name its prompts lack), which pre-training and the retrieval tools do not",
        )
    prompts = st_config.get("prompts", {})
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise HFFolderError(st_path, f"prompts must map names to strings, got {prompts!r}")
    if st_config.get("truncate_dim") is not None:
        raise HFFolderError(
            st_path,
            f"truncate_dim {st_config['truncate_dim']!r}: sentence-transformers keeps only the first dimensions of "
            "every vector, which the import cannot carry into fairseq",
        )
    normalizes = kinds[-1] == "Normalize"
    similarity = declared_similarity(folder, normalizes)
    return Representation(ST_TO_PLUGIN[modes[0]], similarity, max_length, similarity == "cosine" and not normalizes)
