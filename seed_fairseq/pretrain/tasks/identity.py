"""The data folder and the dictionary's identity: refusals before training, and the check of every restored checkpoint.

The dictionary's SHA-256 travels in every checkpoint's task state; a checkpoint trained with
another dictionary, or whose model has fewer positions than a block, is refused.
"""

import logging
import os
from typing import Dict, List

from fairseq import utils
from fairseq.data import Dictionary

from ...base.errors import ConfigurationError
from ..checkpoint import DICTIONARY_SHA256, CheckpointError
from ..checkpoint_records import check_dictionary

logger = logging.getLogger(__name__)

POSITIONS_KEY = "encoder.sentence_encoder.embed_positions.weight"


def check_data_paths(data: str, paths: List[str]) -> None:
    """fairseq reads DATA as ``DIR1:DIR2:...`` (one folder per epoch): a folder whose
    name holds ':' is split apart, and the error must say so."""
    if len(paths) < 2 or "://" in data:
        return
    if os.path.isdir(data):
        raise ConfigurationError(
            "the folder's name contains ':', which fairseq reads as a list of data folders "
            "(DATA1:DATA2:...); rename it, or pass a symbolic link to it whose name has no ':'",
            data,
        )
    for path in paths:
        if not os.path.isdir(path):
            raise ConfigurationError(
                f"data folder not found (fairseq split DATA {data!r} at ':' into {len(paths)} folders)", path
            )


class DictionaryIdentity:
    """The task's dictionary: loaded from DATA with its refusals, its identity checked on restore."""

    @classmethod
    def load_dict(cls, cfg) -> Dictionary:
        paths = utils.split_paths(cfg.data)
        if not paths:
            raise ConfigurationError("no data directory given")
        check_data_paths(cfg.data, paths)
        dict_path = os.path.join(paths[0], "dict.txt")
        if not os.path.isfile(dict_path):
            raise ConfigurationError(
                "dictionary not found; DATA must be a folder written by "
                "fairseq-preprocess (or python -m preprocess.build) holding dict.txt",
                dict_path,
            )
        dictionary = Dictionary.load(dict_path)
        if len(dictionary) <= dictionary.nspecial:
            raise ConfigurationError("dictionary has no symbols besides the specials", dict_path)
        logger.info("dictionary: {} types".format(len(dictionary)))
        return dictionary

    # -- the dictionary identity travels with every checkpoint (task_state) ------------

    def state_dict(self) -> Dict[str, str]:
        return {DICTIONARY_SHA256: self.dictionary_sha256}

    def load_state_dict(self, state_dict) -> None:
        """Called by fairseq's ``load_model_ensemble`` with the checkpoint's task state
        (the tools that read whole checkpoints call ``check_checkpoint`` themselves)."""
        if state_dict and state_dict.get(DICTIONARY_SHA256):
            self.check_checkpoint({"task_state": state_dict}, "the checkpoint")

    def check_checkpoint(self, state, filename) -> None:
        """Refuse a checkpoint trained with another dictionary (size or symbols), or whose
        model has fewer positions than a block (an imported model's, restored without
        the ``--max-positions`` of its ``model_args.txt``)."""
        check_dictionary(
            state, filename, self.dict_path, len(self.source_dictionary), allow_change=self.cfg.allow_dictionary_change
        )
        table = (state.get("model") or {}).get(POSITIONS_KEY)
        if table is not None:
            positions = int(table.shape[0]) - self.source_dictionary.pad() - 1  # fairseq's learned positions
            if positions < self.cfg.tokens_per_sample:
                raise CheckpointError(
                    filename,
                    f"the model has {positions} positions, fewer than --tokens-per-sample "
                    f"{self.cfg.tokens_per_sample}: use --tokens-per-sample {positions} or less",
                )
