"""A local HuggingFace model folder, checked before transformers or sentence-transformers
build a model from it.

transformers fills a size that ``config.json`` does not set with its default (12
layers, 768 wide) and initialises at random whatever the weights then lack; it
reports a corrupt weight index, a negative size or a ``config.json`` that is a JSON
list as a traceback from deep inside the library.  The checks here read only
``config.json`` and the weight files' headers, so that a broken folder is one
``FILE: problem`` line (:class:`HFFolderError`) before any model is built, blaming
the file at fault: a size that disagrees with the weights is ``config.json``'s
fault, a shard the index names but the folder lacks is the index's.  The importer
(``import_.py``) and the retrieval tools (``retrieval/search.py``) share them.
"""

import json
import pickle
import re
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Dict, Iterable, Iterator, List, Mapping, Tuple

import torch

from ...pretrain.checkpoint import refused_type, unpickler_reason

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CONFIG = "config.json"
# The weight files in the order transformers looks for them (the first present is used).
WEIGHT_FILES = (
    ("model.safetensors", False),
    ("model.safetensors.index.json", True),
    ("pytorch_model.bin", False),
    ("pytorch_model.bin.index.json", True),
)
# The sizes every BERT-like config names (transformers maps other spellings to these,
# e.g. DistilBERT's ``dim``, through ``config.attribute_map``).
SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
# size -> (the tensor that holds it in BERT-like encoders, its dimension); a folder
# without exactly one such tensor is not checked for that size
SHAPE_OF = {
    "vocab_size": (re.compile(r"(?:^|\.)embeddings\.word_embeddings\.weight$"), 0),
    "hidden_size": (re.compile(r"(?:^|\.)embeddings\.word_embeddings\.weight$"), 1),
    "max_position_embeddings": (re.compile(r"(?:^|\.)embeddings\.position_embeddings\.weight$"), 0),
    "intermediate_size": (re.compile(r"(?:^|\.)layer\.0\.intermediate\.dense\.weight$"), 0),
}
# "encoder.layer.11.attention..." -> ("encoder.layer", "11")
LAYER = re.compile(r"^(|.*\.)(layers?)\.(\d+)\.")


class HFFolderError(ValueError):
    """A model folder that cannot be used as it is; ``str()`` is ``FILE: problem``."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def one_line(error: BaseException) -> str:
    """A library's (often multi-line) message as one line, with its type."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def read_config(folder) -> dict:
    """``config.json`` as a dict: present, UTF-8 JSON, an object."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise HFFolderError(path, "not found; a HuggingFace model folder has one")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HFFolderError(path, f"not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise HFFolderError(path, f"not a JSON object but a {type(cfg).__name__}: not a model configuration")
    return cfg


def transformers_config(folder) -> "PretrainedConfig":
    """transformers' reading of ``config.json`` (its type checks included), or an
    :class:`HFFolderError` naming the file."""
    from transformers import AutoConfig

    read_config(folder)
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # ValueError, OSError, huggingface_hub's StrictDataclassError, ...
        raise HFFolderError(Path(folder) / CONFIG, f"not a valid model configuration ({one_line(e)})") from None


def check_sizes(sizes: Mapping[str, object], path, required: Collection[str] = ()) -> None:
    """Each of :data:`SIZES` in ``sizes`` that is an integer is >= 1; those in ``required``
    are there and are integers (another kind, e.g. a list per layer, is left to
    transformers' own type checks).

    A size of 0 or less is a ZeroDivisionError or a negative-dimension error when
    the model is built; a missing one would be a default that fits no weights.
    """
    for key in SIZES:
        value = sizes.get(key)
        if value is None and key in required:
            raise HFFolderError(path, f"no {key!r}: the model cannot be built without it")
        plain = isinstance(value, int) and not isinstance(value, bool)
        if (key in required and not plain) or (plain and value < 1):
            raise HFFolderError(path, f"{key} must be an integer >= 1, got {value!r}")


def config_sizes(config, raw: Mapping) -> Tuple[Dict[str, object], List[str]]:
    """(the :data:`SIZES` a transformers config has, those of them ``config.json`` does
    not set, i.e. transformers' defaults)."""
    sizes, unset = {}, []
    aliases = getattr(config, "attribute_map", {}) or {}
    for key in SIZES + ("embedding_size",):
        value = getattr(config, key, None)
        if value is None:
            continue
        sizes[key] = value
        if aliases.get(key, key) not in raw:
            unset.append(key)
    return sizes, unset


def weight_files(folder) -> List[Path]:
    """The files transformers would read the weights from (the shards of an index)."""
    folder = Path(folder)
    for name, sharded in WEIGHT_FILES:
        if (folder / name).is_file():
            return _shards(folder / name) if sharded else [folder / name]
    raise HFFolderError(folder, "no model weights (model.safetensors, pytorch_model.bin, or an index of shards)")


def _shards(index: Path) -> List[Path]:
    try:
        spec = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HFFolderError(index, f"not JSON ({e})") from None
    weight_map = spec.get("weight_map") if isinstance(spec, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise HFFolderError(index, 'not a weight index: it needs "weight_map": {tensor name: shard file}')
    names = sorted(set(weight_map.values()))
    for name in names:
        # a shard is a file beside the index, never a path elsewhere
        if Path(name).name != name or name in (".", ".."):
            raise HFFolderError(index, f"shard {name!r} is not a file name in this folder")
        if not (index.parent / name).is_file():
            raise HFFolderError(index, f"names the shard {name}, which is not in the folder")
    return [index.parent / name for name in names]


def _load_file(path: Path) -> Dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is a page of advice ending in a suggestion to turn the allowlist off; say it in one line
        name = refused_type(str(e))
        if name is None:
            raise HFFolderError(path, f"cannot read the weights ({unpickler_reason(str(e))})") from None
        raise HFFolderError(
            path,
            f"holds a pickled {name!r} object, not tensors; loading it could run code (use model.safetensors)",
        ) from None
    except Exception as e:  # safetensors, pickle and zip report damage in many types
        raise HFFolderError(path, f"cannot read the weights ({one_line(e)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HFFolderError(path, "not a state dict of tensors")
    return state


def read_weights(folder) -> Dict[str, torch.Tensor]:
    """Every tensor of the folder's weights (all shards), as stored."""
    return {k: v for path in weight_files(folder) for k, v in _load_file(path).items()}


def iter_weights(folder) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, tensor) of the folder's weights one tensor at a time (safetensors read lazily, so a large
    model is checked without holding it twice)."""
    for path in weight_files(folder):
        if path.suffix != ".safetensors":
            yield from _load_file(path).items()
            continue
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                for key in f.keys():
                    yield key, f.get_tensor(key)
        except Exception as e:  # SafetensorError, OSError, ...
            raise HFFolderError(path, f"cannot read the weights ({one_line(e)})") from None


def check_finite(named: Iterable[Tuple[str, torch.Tensor]], path) -> None:
    """:class:`HFFolderError` naming ``path`` when a floating-point tensor of ``named`` ((name, tensor)
    pairs: weights, parameters) holds NaN or an infinity: a broken model, or one whose training
    diverged, computes nothing a tool may report or train on."""
    bad = [name for name, v in named if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise HFFolderError(
            path, f"weights hold NaN or infinite values ({bad[0]}{more}): a broken model, or one whose training "
            "diverged, is not used",
        )  # fmt: skip


def _header_shapes(path: Path) -> Dict[str, Tuple[int, ...]]:
    if path.suffix != ".safetensors":  # pytorch_model.bin has no header: read it
        return {k: tuple(v.shape) for k, v in _load_file(path).items()}
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # SafetensorError, OSError, ...
        raise HFFolderError(path, f"not a readable safetensors file ({one_line(e)})") from None


def weight_shapes(folder) -> Dict[str, Tuple[int, ...]]:
    """Tensor name -> shape of the folder's weights; reads only the safetensors headers."""
    return {k: v for path in weight_files(folder) for k, v in _header_shapes(path).items()}


def check_fits_weights(
    sizes: Mapping[str, object], shapes: Mapping[str, Tuple[int, ...]], config_path, unset: Collection[str] = ()
) -> None:
    """The sizes of ``config.json`` against the shapes of the weights; a mismatch is
    ``config.json``'s fault (transformers builds the model from it, and would refuse
    the weights, or initialise the layers they lack at random).

    ``unset``: sizes transformers took from its defaults (said in the message).
    """

    def said(key: str) -> str:
        default = " (config.json does not set it: transformers' default)" if key in unset else ""
        return f"{key} is {sizes[key]}{default}"

    for key, (pattern, dim) in SHAPE_OF.items():
        found = [(name, shape) for name, shape in shapes.items() if pattern.search(name)]
        if key not in sizes or len(found) != 1 or len(found[0][1]) <= dim:
            continue
        if key == "hidden_size" and "embedding_size" in sizes:
            continue  # factorised embeddings (ALBERT): their width is not the hidden size
        name, shape = found[0]
        if shape[dim] != sizes[key]:
            raise HFFolderError(config_path, f"{said(key)} but the weights' {name} has shape {list(shape)}")
    layers: Dict[str, set] = {}
    for name in shapes:
        m = LAYER.match(name)
        if m:
            layers.setdefault(m.group(1) + m.group(2), set()).add(int(m.group(3)))
    # one stack of layers only: an encoder-decoder or a two-tower model is not checked
    if len(layers) == 1 and isinstance(sizes.get("num_hidden_layers"), int):
        ((prefix, found_layers),) = layers.items()
        if max(found_layers) + 1 != sizes["num_hidden_layers"] or len(found_layers) != max(found_layers) + 1:
            raise HFFolderError(
                config_path,
                f"{said('num_hidden_layers')} but the weights hold {len(found_layers)} layer(s) "
                f"({prefix}.{min(found_layers)} .. {prefix}.{max(found_layers)})",
            )


def check_folder(folder) -> None:
    """A folder transformers will build a model from: ``config.json`` readable by
    transformers, its sizes >= 1 and fitting the weights, the weight files readable
    (headers only).  For any architecture; the sizes are checked where they have
    their usual (BERT-like) names and tensors."""
    folder = Path(folder)
    raw = read_config(folder)
    sizes, unset = config_sizes(transformers_config(folder), raw)
    check_sizes(sizes, folder / CONFIG)
    check_fits_weights(sizes, weight_shapes(folder), folder / CONFIG, unset)
