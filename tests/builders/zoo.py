"""Tiny random models for the text zoo: cross-encoders, classifiers, SPLADE, ColBERT, BGE-M3.

Each is saved the way its real counterpart ships, so the server loads it through its own
detection and loading code and tests compare against a reference on the same weights.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast

from tests.builders.text import bpe_tokenizer, wordpiece_tokenizer, write_json

SMALL: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def one_label(labels: int = 1) -> dict[str, Any]:
    """`num_labels` for a config (a keyword the configs take, though their stubs do not list it)."""
    return {"num_labels": labels}


def tiny_cross_encoder(
    root: Path,
    *,
    labels: int = 1,
    seed: int = 0,
    max_length: int = 128,
    names: Sequence[str] = (),
    initializer_range: float = 0.02,
    segment_ids: bool = False,
) -> Path:
    """A BertForSequenceClassification with `labels` outputs (1: a reranker; more: a classifier),
    named by `names` (else negative, neutral, positive, other). A wider `initializer_range` (0.3)
    makes its answers differ by input far beyond a test's tolerance; at BERT's 0.02 they differ
    in the fourth decimal. With `segment_ids` its tokenizer gives a pair's token types."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer(max_length=max_length, segment_ids=segment_ids)
    chosen = list(names or ["negative", "neutral", "positive", "other"])[:labels]
    config = BertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        initializer_range=initializer_range,
        **SMALL,
        **one_label(labels),
    )
    if labels > 1:
        config.id2label, config.label2id = dict(enumerate(chosen)), {v: k for k, v in enumerate(chosen)}
    model = BertForSequenceClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=0.5)  # spread the scores apart
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def tiny_xlmr_cross_encoder(root: Path, *, seed: int = 0) -> Path:
    """An XLMRobertaForSequenceClassification with one label (a multilingual reranker's shape)."""
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    from tests.builders.xlmr import unigram_tokenizer

    torch.manual_seed(seed)
    tokenizer = unigram_tokenizer()
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        pad_token_id=tokenizer.pad_token_id,
        **one_label(),
        **SMALL,
    )
    XLMRobertaForSequenceClassification(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def tiny_modernbert_cross_encoder(root: Path, *, seed: int = 0) -> Path:
    """A ModernBertForSequenceClassification with one label; its tokenizer gives no segment ids."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer()
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        **one_label(),
    )
    ModernBertForSequenceClassification(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def tiny_llm_reranker(root: Path, *, seed: int = 0, config_pad: bool = True) -> Path:
    """A Qwen2ForSequenceClassification with one label, scored on its last token; without
    `config_pad` its config names no pad token (as many LLM rerankers ship)."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = bpe_tokenizer(padding_side="left")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        num_key_value_heads=1,
        max_position_embeddings=128,
        **one_label(),
        pad_token_id=tokenizer.pad_token_id if config_pad else None,
        **SMALL,
    )
    Qwen2ForSequenceClassification(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def tiny_masked_lm(root: Path, *, seed: int = 0, sparse_layout: bool = False) -> Path:
    """A BertForMaskedLM usable as SPLADE; with `sparse_layout`, in the SparseEncoder layout."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SMALL)
    BertForMaskedLM(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    if sparse_layout:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_SpladePooling",
                "type": "sentence_transformers.sparse_encoder.models.SpladePooling",
            },
        ]
        write_json(root / "modules.json", modules)
        write_json(
            root / "1_SpladePooling" / "config.json",
            {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": len(tokenizer)},
        )
        write_json(root / "sentence_bert_config.json", {"max_seq_length": 64, "do_lower_case": False})
    return root


def colbert_tokenizer(max_length: int = 128) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer whose vocabulary holds colbert-ai's [unusedN] and PyLate's [Q]/[D] markers."""
    specials = ("[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[Q]", "[D]")
    return wordpiece_tokenizer(max_length, specials)


def tiny_colbert(root: Path, *, dim: int = 16, query_maxlen: int = 12, doc_maxlen: int = 24, seed: int = 0) -> Path:
    """A colbert-ai checkpoint: BERT weights under `bert.`, `linear.weight`, and `artifact.metadata`."""
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = colbert_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SMALL)
    config.architectures = ["HF_ColBERT"]
    bert = BertModel(config, add_pooling_layer=False).eval()
    linear = torch.nn.Linear(32, dim, bias=False)
    state = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    state["linear.weight"] = linear.weight.detach().contiguous()
    root.mkdir(parents=True, exist_ok=True)
    save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(root)
    tokenizer.save_pretrained(root)
    metadata = {
        "dim": dim,
        "query_maxlen": query_maxlen,
        "doc_maxlen": doc_maxlen,
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
        "mask_punctuation": True,
        "attend_to_mask_tokens": False,
        "similarity": "cosine",
    }
    (root / "artifact.metadata").write_text(json.dumps(metadata, indent=2))
    return root


def pylate_files(root: Path, *, hidden: int, dim: int, settings: dict[str, Any]) -> None:
    """PyLate's files around a saved encoder: a bias-free `1_Dense`, modules.json and its settings."""
    from safetensors.torch import save_file

    linear = torch.nn.Linear(hidden, dim, bias=False)
    (root / "1_Dense").mkdir()
    save_file({"linear.weight": linear.weight.detach().contiguous()}, str(root / "1_Dense" / "model.safetensors"))
    write_json(
        root / "1_Dense" / "config.json",
        {
            "in_features": hidden,
            "out_features": dim,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
        },
    )
    write_json(
        root / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
        ],
    )
    length = int(settings.get("document_length", 180))
    write_json(root / "sentence_bert_config.json", {"max_seq_length": length - 1, "do_lower_case": False})
    extra = {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "MaxSim", **settings}
    write_json(root / "config_sentence_transformers.json", extra)


def tiny_pylate(
    root: Path,
    *,
    dim: int = 16,
    query_length: int = 12,
    document_length: int = 24,
    prefixes: tuple[str, str] = ("[Q] ", "[D] "),
    seed: int = 0,
) -> Path:
    """A PyLate checkpoint on BERT: Transformer + bias-free Dense and ColBERT settings. With prefixes
    `[unused0]`/`[unused1]`, a colbert-ai model (answerai-colbert-small) as PyLate saves it."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = colbert_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SMALL)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    settings = {
        "model_type": "ColBERT",
        "query_prefix": prefixes[0],
        "document_prefix": prefixes[1],
        "query_length": query_length,
        "document_length": document_length,
        "do_query_expansion": True,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list("!,.?"),
    }
    pylate_files(root, hidden=32, dim=dim, settings=settings)
    return root


def modernbert_tokenizer(max_length: int = 128) -> PreTrainedTokenizerFast:
    """A byte-level BPE with ModernBERT's [CLS]/[SEP]/[MASK] specials and no segment ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from tests.builders.text import CORPUS

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        CORPUS * 5, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return tokenizer


def tiny_modern_colbert(
    root: Path,
    *,
    dim: int = 16,
    query_length: int = 12,
    document_length: int = 24,
    expansion: bool = True,
    attend: bool = False,
    seed: int = 0,
) -> Path:
    """GTE-ModernColBERT's layout: ModernBERT, "[Q] "/"[D] " (with the space) as added tokens, PyLate's Dense."""
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(seed)
    tokenizer = modernbert_tokenizer()
    tokenizer.add_tokens(["[Q] ", "[D] "])  # as PyLate adds its prefixes before training
    config = ModernBertConfig(
        vocab_size=len(tokenizer) + 6,  # ModernBERT's embedding table is wider than its vocabulary
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        local_attention=8,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    ModernBertModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    settings = {
        "model_type": "ColBERT",
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": query_length,
        "document_length": document_length,
        "attend_to_expansion_tokens": attend,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": expansion,
    }
    pylate_files(root, hidden=32, dim=dim, settings=settings)
    return root


def tiny_bge_m3(root: Path, *, seed: int = 0) -> Path:
    """An XLM-RoBERTa encoder with FlagEmbedding's `colbert_linear.pt` and `sparse_linear.pt`."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from tests.builders.xlmr import unigram_tokenizer

    torch.manual_seed(seed)
    tokenizer = unigram_tokenizer()
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=130,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        **SMALL,
    )
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    colbert = torch.nn.Linear(32, 32)
    sparse = torch.nn.Linear(32, 1)
    torch.nn.init.normal_(sparse.weight, std=0.5)
    torch.save(colbert.state_dict(), root / "colbert_linear.pt")
    torch.save(sparse.state_dict(), root / "sparse_linear.pt")
    return root
