"""Tiny random models of published families no other builder covers, each in its published layout:
the module types, the pooling flags, the Dense weights' file and the configs' keys as the hub
checkpoints have them (sentence-transformers 2.x-5.x names, pickled Dense weights, legacy pooling
flags), so that the server meets the files it meets in the field.

- MPNet (all-mpnet-base-v2: mean, normalised; multi-qa-mpnet-base-dot-v1: CLS, dot, not normalised)
- LaBSE: cased BERT, CLS, Dense with tanh, normalised
- sentence-t5 / gtr-t5: `T5EncoderModel`, mean, a bias-free Dense, normalised
- mxbai-embed-large-v1: BERT, CLS, query and passage prompts, not normalised
- granite-embedding (RoBERTa, CLS) and all-distilroberta-v1 (RoBERTa, mean) on the same weights
- msmarco-distilbert-base-v4: DistilBERT, mean, not normalised
- e5-mistral-7b-instruct: `MistralModel`, last token, EOS appended by the tokenizer, instruct prompts
- cross-encoders: ms-marco-MiniLM-L6-v2 (BERT, Identity), ms-marco-electra-base (ELECTRA),
  stsb-distilroberta-base (RoBERTa, sigmoid)
- a CamemBERT classifier with several labels
- SPLADE on DistilBERT (splade-v3-distilbert) as a sentence-transformers 5 SparseEncoder
- colbertv2.0: colbert-ai's `HF_ColBERT` with pickled weights and its `artifact.metadata`
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from tests.builders.text import CORPUS, wordpiece_tokenizer, write_json
from tests.builders.xlmr import unigram_tokenizer
from tests.builders.zoo import SMALL, colbert_tokenizer, one_label

ST = "sentence_transformers.models"
MXBAI_PROMPTS = {"query": "Represent this sentence for searching relevant passages: ", "passage": ""}
E5_MISTRAL_PROMPTS = {
    "web_search_query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: ",
    "sts_query": "Instruct: Retrieve semantically similar text.\nQuery: ",
}
#: LaBSE's and mxbai's encoders share one vocabulary size, hence one set of weights and one
#: converted engine artifact (its key hashes the weights and config.json): half the conversions.
BERT_VOCAB = 400
SENTIMENT = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")


# ---- tokenizers ---------------------------------------------------------------------------------


def mpnet_tokenizer(max_length: int = 128) -> PreTrainedTokenizerFast:
    """MPNet's: lower-cased WordPiece, `<s> A </s>` and `<s> A </s></s> B </s>`, no segment ids."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    tok.train_from_iterator(CORPUS * 5, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials))
    tok.post_processor = roberta_pairs("<s>", "</s>")
    tok.decoder = decoders.WordPiece()
    return _named(
        tok,
        max_length,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        unk_token="[UNK]",
        pad_token="<pad>",
        mask_token="<mask>",
    )


def roberta_pairs(cls: str, sep: str) -> Any:
    """RoBERTa's template, `<s> A </s>` and `<s> A </s></s> B </s>` (ids 0 and 2)."""
    return processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}", special_tokens=[(cls, 0), (sep, 2)]
    )


def cased_wordpiece(max_length: int = 128) -> PreTrainedTokenizerFast:
    """LaBSE's: a BERT WordPiece trained and run without lower-casing, with segment ids."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS * 5, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.decoder = decoders.WordPiece()
    return _named(
        tok,
        max_length,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def roberta_tokenizer(max_length: int = 128) -> PreTrainedTokenizerFast:
    """RoBERTa's byte-level BPE: `<s>`=0, `<pad>`=1, `</s>`=2, a pair as `<s> A </s></s> B </s>`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        CORPUS * 5, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet)
    )
    tok.post_processor = roberta_pairs("<s>", "</s>")
    return _named(
        tok,
        max_length,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
    )


def t5_tokenizer(max_length: int = 128) -> PreTrainedTokenizerFast:
    """T5's SentencePiece unigram: `<pad>`=0, `</s>`=1, `<unk>`=2, `</s>` after each text."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        CORPUS * 5,
        trainers.UnigramTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    return _named(tok, max_length, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def mistral_tokenizer(max_length: int = 128) -> Any:
    """Mistral's Llama tokenizer (byte-fallback BPE on `▁`) with e5-mistral's settings: `<s>` before
    and `</s>` after each text (`add_eos_token: true`), `</s>` as the pad token."""
    from transformers import LlamaTokenizer

    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    trained.train_from_iterator(
        CORPUS * 5, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    )
    state = json.loads(trained.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    return LlamaTokenizer(
        vocab=state["vocab"],
        merges=merges,
        add_bos_token=True,
        add_eos_token=True,
        pad_token="</s>",
        padding_side="left",
        model_max_length=max_length,
    )


def _named(tok: Tokenizer, max_length: int, **tokens: Any) -> PreTrainedTokenizerFast:
    names = tokens.pop("model_input_names", ["input_ids", "attention_mask"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, model_input_names=names, **tokens)


# ---- sentence-transformers files as the hub has them ---------------------------------------------


def st_files(
    root: Path,
    *,
    hidden: int,
    pooling: str,
    dense: tuple[int, bool, str] | None = None,
    normalize: bool,
    max_seq_length: int,
    do_lower_case: bool = False,
    prompts: dict[str, str] | None = None,
    similarity: str | None = None,
) -> Path:
    """modules.json, the legacy pooling flags, a Dense (out features, bias, activation) with its
    weights pickled as `pytorch_model.bin`, and the two settings files."""
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": f"{ST}.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{ST}.Pooling"},
    ]
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    chosen = {"cls": "cls_token", "mean": "mean_tokens", "lasttoken": "lasttoken"}[pooling]
    write_json(
        root / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": hidden,
            **{f"pooling_mode_{m}": m == chosen for m in modes},
            "include_prompt": True,
        },
    )
    if dense is not None:
        out, bias, activation = dense
        layer = torch.nn.Linear(hidden, out, bias=bias)
        torch.nn.init.normal_(layer.weight, std=0.3)
        (root / "2_Dense").mkdir()
        torch.save({f"linear.{k}": v for k, v in layer.state_dict().items()}, root / "2_Dense" / "pytorch_model.bin")
        write_json(
            root / "2_Dense" / "config.json",
            {"in_features": hidden, "out_features": out, "bias": bias, "activation_function": activation},
        )
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": f"{ST}.Dense"})
    if normalize:
        index = len(modules)
        modules.append({"idx": index, "name": str(index), "path": f"{index}_Normalize", "type": f"{ST}.Normalize"})
    write_json(root / "modules.json", modules)
    write_json(root / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case})
    extra: dict[str, Any] = {
        "__version__": {"sentence_transformers": "3.0.0", "transformers": "4.41.2", "pytorch": "2.3.0"},
        "prompts": prompts or {},
        "default_prompt_name": None,
    }
    if similarity is not None:
        extra["similarity_fn_name"] = similarity
    write_json(root / "config_sentence_transformers.json", extra)
    return root


def _save(model: Any, tokenizer: Any, root: Path) -> Path:
    model.eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def _patch_config(root: Path, *, name: str = "config.json", **keys: Any) -> None:
    path = root / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **keys}, indent=2))


# ---- dense embedders ----------------------------------------------------------------------------


def mpnet_weights(root: Path, *, seed: int = 0) -> Path:
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(seed)
    tokenizer = mpnet_tokenizer()
    config = MPNetConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        relative_attention_num_buckets=32,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SMALL,
    )
    return _save(MPNetModel(config), tokenizer, root)


def tiny_all_mpnet(root: Path) -> Path:
    """all-mpnet-base-v2: mean pooling, Normalize."""
    return st_files(mpnet_weights(root), hidden=32, pooling="mean", normalize=True, max_seq_length=64)


def tiny_multi_qa_mpnet_dot(root: Path) -> Path:
    """multi-qa-mpnet-base-dot-v1: CLS pooling, no Normalize, scored by dot product."""
    return st_files(mpnet_weights(root), hidden=32, pooling="cls", normalize=False, max_seq_length=64, similarity="dot")


def tiny_labse(root: Path, *, seed: int = 0) -> Path:
    """LaBSE: cased BERT with its pooler, CLS, Dense(tanh), Normalize."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = cased_wordpiece()
    config = BertConfig(vocab_size=BERT_VOCAB, max_position_embeddings=128, **SMALL)
    _save(BertModel(config), tokenizer, root)
    dense = (32, True, "torch.nn.modules.activation.Tanh")
    return st_files(root, hidden=32, pooling="cls", dense=dense, normalize=True, max_seq_length=64)


def tiny_sentence_t5(root: Path, *, seed: int = 0) -> Path:
    """sentence-t5-base / gtr-t5-base: the T5 encoder alone, mean, a bias-free Dense, Normalize."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    tokenizer = t5_tokenizer()
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
    )
    _save(T5EncoderModel(config), tokenizer, root)
    dense = (24, False, "torch.nn.modules.linear.Identity")
    return st_files(root, hidden=32, pooling="mean", dense=dense, normalize=True, max_seq_length=64)


def tiny_mxbai_embed(root: Path, *, seed: int = 0) -> Path:
    """mxbai-embed-large-v1: BERT, CLS, no Normalize, a query prompt and an empty passage prompt."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer(segment_ids=True)
    config = BertConfig(vocab_size=BERT_VOCAB, max_position_embeddings=128, **SMALL)
    _save(BertModel(config), tokenizer, root)
    return st_files(
        root, hidden=32, pooling="cls", normalize=False, max_seq_length=64, prompts=MXBAI_PROMPTS, similarity="cosine"
    )


def roberta_weights(root: Path, *, seed: int = 0) -> Path:
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(seed)
    tokenizer = roberta_tokenizer()
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **SMALL,
    )
    return _save(RobertaModel(config), tokenizer, root)


def tiny_granite_embedding(root: Path) -> Path:
    """granite-embedding-30m-english: RoBERTa, CLS, Normalize."""
    return st_files(roberta_weights(root), hidden=32, pooling="cls", normalize=True, max_seq_length=64)


def tiny_all_distilroberta(root: Path) -> Path:
    """all-distilroberta-v1: RoBERTa, mean, Normalize (the same weights as `tiny_granite_embedding`)."""
    return st_files(roberta_weights(root), hidden=32, pooling="mean", normalize=True, max_seq_length=64)


def tiny_msmarco_distilbert(root: Path, *, seed: int = 0) -> Path:
    """msmarco-distilbert-base-v4: DistilBERT, mean, no Normalize."""
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(seed)
    tokenizer = distilbert_tokenizer()
    config = DistilBertConfig(
        vocab_size=len(tokenizer), dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=128
    )
    _save(DistilBertModel(config), tokenizer, root)
    return st_files(root, hidden=32, pooling="mean", normalize=False, max_seq_length=64, similarity="cosine")


def distilbert_tokenizer() -> PreTrainedTokenizerFast:
    """DistilBERT's: BERT's WordPiece without segment ids."""
    tokenizer = wordpiece_tokenizer()
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return tokenizer


def tiny_e5_mistral(root: Path, *, seed: int = 0) -> Path:
    """e5-mistral-7b-instruct: `MistralModel`, last token (the appended `</s>`), Normalize, prompts."""
    from transformers import MistralConfig, MistralModel

    torch.manual_seed(seed)
    tokenizer = mistral_tokenizer()
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    _save(MistralModel(config), tokenizer, root)
    bos_only(root)
    return st_files(root, hidden=32, pooling="lasttoken", normalize=True, max_seq_length=64, prompts=E5_MISTRAL_PROMPTS)


def bos_only(root: Path) -> None:
    """The tokenizer files as e5-mistral publishes them: tokenizer.json adds `<s>` alone, and
    tokenizer_config.json's `add_eos_token` asks for the `</s>` that last-token pooling reads."""
    path = root / "tokenizer.json"
    saved = json.loads(path.read_text())
    saved["post_processor"] = json.loads(
        processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 1)]
        ).__getstate__()
    )
    path.write_text(json.dumps(saved))
    _patch_config(root, add_bos_token=True, add_eos_token=True, name="tokenizer_config.json")


# ---- cross-encoders and classifiers --------------------------------------------------------------


def _spread(model: Any) -> Any:
    """A classifier whose scores differ by input far beyond the tests' tolerance: its last layer
    drawn wide (a wider hidden layer too would saturate the sigmoid)."""
    for name, parameter in model.named_parameters():
        if name in ("classifier.weight", "classifier.out_proj.weight"):
            torch.nn.init.normal_(parameter, std=0.5)
    return model


def tiny_ms_marco_minilm(root: Path, *, seed: int = 0) -> Path:
    """ms-marco-MiniLM-L6-v2 as sentence-transformers 4 saved it: raw logits (`Identity`)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer(segment_ids=True)
    config = BertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=128, initializer_range=0.2, **SMALL, **one_label()
    )
    _save(_spread(BertForSequenceClassification(config)), tokenizer, root)
    _patch_config(root, sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity", "version": "4.0.1"})
    return root


def tiny_ms_marco_electra(root: Path, *, seed: int = 0) -> Path:
    """ms-marco-electra-base: ElectraForSequenceClassification, one label, sigmoid by default."""
    from transformers import ElectraConfig, ElectraForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer(segment_ids=True)
    config = ElectraConfig(
        vocab_size=len(tokenizer),
        embedding_size=32,
        max_position_embeddings=128,
        initializer_range=0.2,
        **SMALL,
        **one_label(),
    )
    return _save(_spread(ElectraForSequenceClassification(config)), tokenizer, root)


def tiny_stsb_distilroberta(root: Path, *, seed: int = 0) -> Path:
    """stsb-distilroberta-base: RobertaForSequenceClassification, one label, sigmoid (pre-v4 key)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = roberta_tokenizer()
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        initializer_range=0.2,
        **SMALL,
        **one_label(),
    )
    _save(_spread(RobertaForSequenceClassification(config)), tokenizer, root)
    _patch_config(root, sbert_ce_default_activation_function="torch.nn.modules.activation.Sigmoid")
    return root


def _labelled(config: Any, names: tuple[str, ...]) -> Any:
    config.id2label, config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}
    return config


def tiny_camembert_classifier(root: Path, *, seed: int = 0) -> Path:
    """A CamemBERT sentiment classifier with five labels (distilcamembert-base-sentiment's shape)."""
    from transformers import CamembertConfig, CamembertForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = unigram_tokenizer()
    config = CamembertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.2,
        **SMALL,
        **one_label(len(SENTIMENT)),
    )
    return _save(_spread(CamembertForSequenceClassification(_labelled(config, SENTIMENT))), tokenizer, root)


# ---- SPLADE and ColBERT --------------------------------------------------------------------------


def tiny_splade_distilbert(root: Path, *, seed: int = 0) -> Path:
    """splade-v3-distilbert: DistilBertForMaskedLM under sentence-transformers 5's SparseEncoder modules."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    torch.manual_seed(seed)
    tokenizer = distilbert_tokenizer()
    config = DistilBertConfig(
        vocab_size=len(tokenizer), dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=128
    )
    _save(DistilBertForMaskedLM(config), tokenizer, root)
    sparse = "sentence_transformers.sparse_encoder.models"
    write_json(
        root / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": f"{sparse}.MLMTransformer"},
            {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": f"{sparse}.SpladePooling"},
        ],
    )
    write_json(
        root / "1_SpladePooling" / "config.json",
        {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": len(tokenizer)},
    )
    write_json(root / "sentence_bert_config.json", {"max_seq_length": 64, "do_lower_case": False})
    write_json(
        root / "config_sentence_transformers.json",
        {
            "model_type": "SparseEncoder",
            "__version__": {"sentence_transformers": "5.0.0", "transformers": "4.50.3", "pytorch": "2.6.0"},
            "prompts": {"query": "", "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": "dot",
        },
    )
    return root


def tiny_colbertv2(root: Path, *, dim: int = 16, query_maxlen: int = 12, doc_maxlen: int = 24, seed: int = 0) -> Path:
    """colbertv2.0: `HF_ColBERT` (BERT with its pooler under `bert.`, `linear.weight`) pickled as
    `pytorch_model.bin`, and colbert-ai's `artifact.metadata` with its training keys."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = colbert_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SMALL)
    config.architectures = ["HF_ColBERT"]
    bert = BertModel(config).eval()
    state = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    state["linear.weight"] = torch.nn.Linear(32, dim, bias=False).weight.detach().contiguous()
    root.mkdir(parents=True, exist_ok=True)
    torch.save(state, root / "pytorch_model.bin")
    config.save_pretrained(root)
    tokenizer.save_pretrained(root)
    metadata = {
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
        "query_token": "[Q]",
        "doc_token": "[D]",
        "ncells": None,
        "centroid_score_threshold": None,
        "ndocs": None,
        "index_path": None,
        "nbits": 1,
        "kmeans_niters": 20,
        "resume": False,
        "similarity": "cosine",
        "bsize": 32,
        "accumsteps": 1,
        "lr": 1e-05,
        "maxsteps": 400000,
        "warmup": 20000,
        "relu": False,
        "nway": 64,
        "use_ib_negatives": True,
        "reranker": False,
        "distillation_alpha": 1.0,
        "ignore_scores": False,
        "query_maxlen": query_maxlen,
        "attend_to_mask_tokens": False,
        "interaction": "colbert",
        "dim": dim,
        "doc_maxlen": doc_maxlen,
        "mask_punctuation": True,
        "checkpoint": "colbert-ir/colbertv2.0",
        "root": "experiments",
        "experiment": "default",
        "rank": 0,
        "nranks": 4,
        "amp": True,
    }
    (root / "artifact.metadata").write_text(json.dumps(metadata, indent=4))
    return root
