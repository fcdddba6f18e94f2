"""Export a seed_pretrain (or encoder-only) checkpoint to HuggingFace transformers.

Rooms: ``texts.py`` (how raw text becomes ids), ``card.py`` (the model card),
``sentence.py`` (the sentence-transformers modules: the model's pooling, normalisation and
similarity, as the checkpoint records them), ``representation.py`` (what a retrieval
representation adds beside the encoder: nothing for ``own`` and ``cls``, DupMAE's head files
through ``seed_fairseq/encoders/dupmae/export.py``).

The encoder maps exactly onto ``XLMRobertaModel`` (RoBERTa architecture:
learned positions with fairseq's padding offset, embedding LayerNorm, post-LN,
no segments); the tokenizer reproduces pre-training's normalisation and ids.
Everything is checked numerically against fairseq BEFORE the output folder
appears: the folder is assembled under a temporary name, reloaded with
``AutoModel``/``AutoTokenizer``/``SentenceTransformer``, compared again, and
only then renamed into place.  ``--force`` on an earlier export replaces
exactly the files its record lists; anything else in the folder stays
(``fileio.staged_output``).
"""

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Tuple, Union

import torch

from ...base.fileio import OutputError, PathLike, owned_output, staged_dir
from ...base.representation import PAPERS, Representation, of_options
from ...base.vocabulary.dictionary import dictionary_sha256
from ...base.vocabulary.tokenizer import RECORD as VOCAB_RECORD
from ...base.vocabulary.tokenizer import (
    TOKENIZER_DIR,
    TokenizerError,
    fairseq_to_hf_from_record,
    load_fast_tokenizer,
    vocab_from_tokenizer,
)
from ...base.vocabulary.tokenizer import load_record as load_vocab_record
from ...pretrain.checkpoint import CheckpointError, plain_config, read_checkpoint
from ...pretrain.checkpoint_records import check_dictionary, encoder_architecture
from ...pretrain.checkpoint_records import representation_options as recorded_options
from . import representation as representations
from .card import model_card
from .export_check import verify, verify_representation
from .folder import HFFolderError, check_finite
from .import_keymap import fairseq_positions_to_hf
from .keymap import fairseq_to_hf
from .representation import ExportError, ExportJob
from .sentence import st_modules
from .texts import HFTexts, SpmTexts, check_texts

if TYPE_CHECKING:
    from fairseq.data import Dictionary
    from transformers import XLMRobertaConfig

logger = logging.getLogger("seed_fairseq.hf")

# written last into every export: the folder is this tool's own, and these its files
# (see fileio.staged_output)
EXPORT_RECORD = "seed_fairseq_export.json"
TOOL = "examples/export_to_hf.py"


def _architecture_problems(m):
    """Why an encoder config has no exact XLMRobertaModel equivalent ([] if it has one)."""
    want = {
        "encoder_normalize_before": False,  # HF RoBERTa is post-LN
        "layernorm_embedding": True,
        "no_scale_embedding": True,
        "encoder_learned_pos": True,
        "no_token_positional_embeddings": False,
        "untie_weights_roberta": False,
        "adaptive_input": False,
    }
    problems = [f"{k}={m.get(k)!r} (HF RoBERTa needs {v!r})" for k, v in want.items() if m.get(k, v) != v]
    if m.get("activation_fn", "gelu") not in ACTIVATIONS:
        problems.append(f"activation_fn={m.get('activation_fn')!r} (supported: {sorted(ACTIVATIONS)})")
    if m.get("encoder_layers_to_keep"):
        problems.append("encoder_layers_to_keep is set (prune the checkpoint first)")
    for k in ("quant_noise_pq", "quant_noise_scalar"):
        if m.get(k, 0):
            problems.append(f"{k}={m.get(k)} (quantisation noise)")
    return problems


# fairseq activation -> HF hidden_act computing the same function
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_accurate": "gelu_new", "tanh": "tanh"}


def _hf_texts(data, dictionary, rec):
    """The HF tokenizer of a data/import folder, checked against its record and dict.txt."""
    try:
        tok = load_fast_tokenizer(data / TOKENIZER_DIR)
        vocab = vocab_from_tokenizer(tok, data / TOKENIZER_DIR)
    except TokenizerError as e:
        raise ExportError(str(e)) from e
    if vocab.sha256 != rec.get("tokenizer_sha256") or vocab.fairseq_to_hf != fairseq_to_hf_from_record(rec):
        raise ExportError(f"{data / TOKENIZER_DIR}: is not the tokenizer {data / VOCAB_RECORD} records")
    if dictionary.symbols[4:] != vocab.symbols[4:]:
        raise ExportError(f"{data / 'dict.txt'}: does not list the tokenizer's vocabulary in its id order")
    return HFTexts(data, tok, vocab)


def load_inputs(
    checkpoint: PathLike, data: PathLike, trust: bool = False
) -> Tuple[dict, dict, dict, "Dictionary", Union[SpmTexts, HFTexts], Tuple[str, ...]]:
    """Checkpoint, its model config, the data's dictionary and texts (how raw text becomes
    ids), and the state-dict prefixes that are not exported (the pre-training-only modules).
    The checkpoint is loaded without running code from it unless ``trust``
    (``--trust-checkpoint``; ``checkpoint.load_torch_file``)."""
    from fairseq.data import Dictionary

    import seed_fairseq

    seed_fairseq.register()  # the model, and fairseq's checkpoint loading without code

    checkpoint, data = Path(checkpoint), Path(data)
    try:
        hf_record = load_vocab_record(data)
    except TokenizerError as e:
        raise ExportError(str(e)) from e
    needed = ("dict.txt", TOKENIZER_DIR) if hf_record else ("dict.txt", "spm.model", "preprocess.json")
    for name in needed:
        if not (data / name).exists():
            raise ExportError(
                f"{data / name}: not found; --data must be the folder written by python -m preprocess.build "
                "(or by examples/import_from_hf.py)"
            )
    try:
        state = read_checkpoint(checkpoint, arg_overrides={"data": str(data)}, trust=trust)
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    cfg = plain_config(state.get("cfg") or {})
    model_cfg = cfg.get("model") or {}
    name = model_cfg.get("_name") or model_cfg.get("arch")
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    from ...pretrain.models import pretraining_model_class

    model_class = pretraining_model_class(name)
    if model_class is None and ARCH_MODEL_NAME_REGISTRY.get(name, name) != "roberta":
        raise ExportError(
            f"{checkpoint}: model {name!r} is neither one of this plugin's pre-training models nor a roberta encoder"
        )
    # what the export leaves out: the modules the model class declares pre-training-only
    dropped = tuple(model_class.pretraining_only_prefixes) if model_class else ()
    problems = _architecture_problems(model_cfg)
    if problems:
        raise ExportError(f"{checkpoint}: arch {name!r} has no exact HuggingFace equivalent: " + "; ".join(problems))
    try:
        encoder_architecture(model_cfg, checkpoint)  # what the export rebuilds: every fact readable
    except CheckpointError as e:
        raise ExportError(str(e)) from None

    dictionary = Dictionary.load(str(data / "dict.txt"))
    dictionary.add_symbol("<mask>")
    record_all = json.loads((data / "preprocess.json").read_text()) if (data / "preprocess.json").is_file() else {}
    recorded = (record_all.get("fairseq_dictionary") or {}).get("sha256")
    if recorded and recorded != dictionary_sha256(data / "dict.txt"):
        raise ExportError(
            f"{data / 'dict.txt'}: does not match the dictionary {data / 'preprocess.json'} "
            "records (the folder was changed after it was built)"
        )
    try:
        check_dictionary(state, checkpoint, data / "dict.txt", len(dictionary))
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    if hf_record:
        return state, cfg, model_cfg, dictionary, _hf_texts(data, dictionary, hf_record), dropped
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    expected = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]
    if dictionary.symbols[4 : 4 + len(expected)] != expected or len(dictionary) != len(expected) + 5:
        raise ExportError(
            f"{data / 'spm.model'}: its pieces do not match {data / 'dict.txt'} under the XLM-R id rule "
            f"(spm has {sp.get_piece_size()} pieces, the dictionary {len(dictionary)} symbols)"
        )
    return state, cfg, model_cfg, dictionary, SpmTexts(data, dictionary, sp, record_all["normalization"]), dropped


def hf_config(
    model_cfg: dict, vocab_size: int, with_lm_head: bool, pad: int = 1, bos: int = 0, eos: int = 2
) -> "XLMRobertaConfig":
    from transformers import XLMRobertaConfig

    arch = encoder_architecture(model_cfg)  # the checkpoint's own facts (an import of BERT: eps 1e-12)
    return XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=arch.embed_dim,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.attention_heads,
        intermediate_size=arch.ffn_embed_dim,
        hidden_act=ACTIVATIONS[arch.activation_fn],
        hidden_dropout_prob=model_cfg.get("dropout", 0.1),
        attention_probs_dropout_prob=model_cfg.get("attention_dropout", 0.1),
        # positions start after the padding index, in fairseq (1) and in XLM-R (pad)
        max_position_embeddings=arch.max_positions + pad + 1,
        type_vocab_size=1,
        layer_norm_eps=arch.layer_norm_eps,
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
        architectures=["XLMRobertaForMaskedLM" if with_lm_head else "XLMRobertaModel"],
    )


def recorded_representation(state: dict, checkpoint: PathLike = "the checkpoint") -> Representation:
    """The model's representation as the checkpoint records it (``checkpoint_records.representation_options``:
    its task config, or an encoder-only checkpoint's extra_state); the papers' [CLS] and dot product
    for a checkpoint written before it was recorded.  :class:`ExportError` naming ``checkpoint`` for
    a value the export cannot write as sentence-transformers modules."""
    try:
        return of_options(recorded_options(state))
    except ValueError as e:
        raise ExportError(f"{checkpoint}: records {e}") from None


def to_hf_order(
    hf_state: Dict[str, torch.Tensor], texts_source: Union[SpmTexts, HFTexts], with_lm_head: bool
) -> Dict[str, torch.Tensor]:
    """Rows in fairseq id order -> the tokenizer's, positions to its padding index."""
    if texts_source.fairseq_to_hf is None:
        return hf_state
    prefix = "roberta." if with_lm_head else ""
    inverse = torch.as_tensor(texts_source.hf_to_fairseq)
    for key in (prefix + "embeddings.word_embeddings.weight", "lm_head.decoder.weight", "lm_head.bias"):
        if key in hf_state:
            hf_state[key] = hf_state[key][inverse].contiguous()
    if "lm_head.bias" in hf_state:
        hf_state["lm_head.decoder.bias"] = hf_state["lm_head.bias"]
    pos = prefix + "embeddings.position_embeddings.weight"
    hf_state[pos] = fairseq_positions_to_hf(hf_state[pos], texts_source.pad)
    return hf_state


def export(
    checkpoint: PathLike,
    data: PathLike,
    out: PathLike,
    force: bool = False,
    with_lm_head: bool = False,
    atol: float = 1e-5,
    representation: Optional[str] = None,
    trust_checkpoint: bool = False,
    **representation_options,
) -> Path:
    """``representation``: a registered exporter's name (``representation.py``): ``own`` writes
    the sentence-transformers modules of the model's own representation as the checkpoint
    records it (its pooling, ``Normalize`` and similarity: ``recorded_representation``), ``cls``
    the papers' [CLS] and dot product instead, ``dupmae`` adds DupMAE's head files
    (``seed_fairseq/encoders/dupmae/export.py``) to ``own``'s folder; None: the one the checkpoint
    declares (``dupmae`` for a DupMAE checkpoint exported without the MLM head), else ``own``.
    ``representation_options`` go to that exporter: DupMAE's ``dupmae_dim`` (d', default
    min(384, d)) and ``dupmae_top_k`` (k, default min(384, selectable vocabulary)).
    ``trust_checkpoint``: load the checkpoint with the full unpickler (``load_inputs``)."""
    from fairseq import checkpoint_utils
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, XLMRobertaForMaskedLM, XLMRobertaModel

    out = Path(out)
    for option in representation_options:
        if representations.owner_of(option) is None:
            raise TypeError(f"export() got an unexpected keyword argument {option!r}")
    exporter = representations.get(representation) if representation is not None else None
    problem = exporter.refuse(with_lm_head) if exporter is not None else None
    if problem:
        raise ExportError(problem)
    try:
        earlier = owned_output(out, EXPORT_RECORD, TOOL)
    except OutputError as e:
        raise ExportError(str(e)) from e
    if earlier is not None and earlier.complete and not force:
        raise ExportError(f"{out}: holds an earlier export; pass --force to replace it")
    state, cfg, model_cfg, dictionary, texts_source, dropped = load_inputs(checkpoint, data, trust_checkpoint)
    architecture = encoder_architecture(model_cfg, checkpoint)
    max_len = architecture.max_positions
    if exporter is None:
        exporter = representations.OWN if with_lm_head else representations.default_for(cfg)
    sentence = exporter.sentence_representation(recorded_representation(state, checkpoint))
    given = {k: v for k, v in representation_options.items() if v is not None}
    foreign = [representations.owner_of(k) for k in given if k not in exporter.options]
    if foreign:
        raise ExportError(
            f"{checkpoint}: {' / '.join(foreign[0].options.values())} given, but this checkpoint exports the "
            f"{exporter.label} representation (pass --representation {foreign[0].name})"
        )
    try:
        options = exporter.check(checkpoint, state, model_cfg, dictionary, given)
    except ValueError as e:
        raise ExportError(str(e)) from e

    src = texts_source
    config = hf_config(model_cfg, len(dictionary), with_lm_head, pad=src.pad, bos=src.bos, eos=src.eos)
    hf_model = (XLMRobertaForMaskedLM if with_lm_head else XLMRobertaModel)(config).eval()
    try:  # a diverged run's checkpoint: no HF equivalent to compare with, nothing to export
        check_finite(((k, v) for k, v in state["model"].items() if not k.startswith(dropped)), checkpoint)
    except HFFolderError as e:
        raise ExportError(str(e)) from None
    hf_state = fairseq_to_hf(state["model"], architecture.layers, with_lm_head, dropped_prefixes=dropped)
    hf_model.load_state_dict(to_hf_order(hf_state, src, with_lm_head), strict=True)
    tokenizer = src.tokenizer(max_len)

    # reuse the state read by load_inputs (hf_state holds clones) instead of reading the file again
    (fs_model,), _ = checkpoint_utils.load_model_ensemble(
        [str(checkpoint)], arg_overrides={"data": str(data)}, state=state
    )
    fs_model.eval()
    texts = check_texts(src, data)
    diff = verify(fs_model, hf_model, tokenizer, src, texts, max_len, atol, with_lm_head)
    logger.info(f"fairseq vs HF: ids equal on {len(texts)} strings, max abs diff {diff:.2e}")
    job = ExportJob(
        checkpoint=Path(checkpoint),
        data=Path(data),
        state=state,
        model_cfg=model_cfg,
        dictionary=dictionary,
        fs_model=fs_model,
        hf_model=hf_model,
        tokenizer=tokenizer,
        texts=texts,
        max_len=max_len,
        atol=atol,
        activation=ACTIVATIONS[architecture.activation_fn],
        architecture=architecture,
        hf_to_fairseq=None if src.fairseq_to_hf is None else src.hf_to_fairseq,
    )
    try:
        built = exporter.build(job, options)  # checked against fairseq (the in-memory encoder's outputs)
    except ExportError:
        raise
    except ValueError as e:
        raise ExportError(str(e)) from e

    try:
        with staged_dir(out, EXPORT_RECORD, TOOL, replace=force) as (staging, record):
            hf_model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            if not with_lm_head:
                save_sentence_transformer(staging, max_len, sentence)
            card = model_card(cfg, model_cfg, state, src, diff, with_lm_head, sentence)
            if built is not None:
                built.save(staging)
                card += built.card()
            (staging / "README.md").write_text(card)
            # the written folder, reloaded the way users will load it
            auto = (AutoModelForMaskedLM if with_lm_head else AutoModel).from_pretrained(staging).eval()
            verify(
                fs_model,
                auto,
                AutoTokenizer.from_pretrained(staging),
                src,
                texts,
                max_len,
                atol,
                with_lm_head,
            )
            if not with_lm_head:  # the vector users rank with: the written modules against fairseq
                verify_representation(fs_model, staging, src, texts, max_len, sentence, atol)
            if built is not None:  # the representation's files, reloaded the way the retrieval tools load them
                built.verify(staging)
            # the record last: it lists the files --force may replace (nothing else in OUT)
            record.update(
                {
                    "tool": "seed_fairseq.hf.export",
                    "checkpoint": str(Path(checkpoint).resolve()),
                    "data": str(Path(data).resolve()),
                    "dictionary_sha256": dictionary_sha256(Path(data) / "dict.txt"),
                    "with_lm_head": with_lm_head,
                    "representation": exporter.name,
                    # what the sentence-transformers modules compute (retrieval tools read "similarity":
                    # hf/sentence.declared_similarity)
                    "pooling": sentence.pooling,
                    "normalize": sentence.normalize,
                    "similarity": sentence.similarity,
                    "max_seq_length": sentence.seq_length(max_len),  # sentence_bert_config.json's
                    "max_abs_diff": diff,
                },
            )
    except OutputError as e:
        raise ExportError(str(e)) from None
    logger.info(f"wrote {out}")
    return out


def save_sentence_transformer(folder: Path, max_len: int, representation: Representation = PAPERS) -> None:
    """The sentence-transformers files of ``folder`` (a saved encoder): the ``representation``'s
    pooling, a ``Normalize`` module when it compares by cosine, and its ``similarity_fn_name``
    (default: the papers' [CLS] pooling, no normalisation, dot product)."""
    from sentence_transformers import SentenceTransformer

    Transformer, Pooling, Normalize = st_modules()
    word = Transformer(str(folder), max_seq_length=representation.seq_length(max_len))
    # sentence-transformers >= 5 renamed get_word_embedding_dimension (the old name warns)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    modules = [word, Pooling(dim(), pooling_mode=representation.st_pooling)]
    if representation.normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", similarity_fn_name=representation.similarity)
    model.save(str(folder))
