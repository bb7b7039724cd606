"""Tiny random models built with transformers and saved like the real thing (no download).

Each builder writes a directory that sentence-transformers (or transformers) loads as-is, so tests
compare the server against the reference library on the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "A man is playing a guitar on the stage.",
    "A woman is slicing an onion in the kitchen.",
    "Two dogs are running through the snow.",
    "The cat sleeps on the warm windowsill.",
    "Children are playing football in the park.",
    "A plane is taking off from the airport.",
    "The stock market fell sharply on Monday.",
    "Scientists discovered a new species of frog.",
    "hello world, this is a test of the tokenizer!",
    "What is the capital of France? Paris is the capital.",
]


BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def wordpiece_tokenizer(
    max_length: int = 128, specials: tuple[str, ...] = BERT_SPECIALS, *, segment_ids: bool = False
) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer trained on a few sentences; `specials` take the first ids.
    With `segment_ids` it gives `token_type_ids` (1 on a pair's second text), as BERT's own does."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS * 5, trainers.WordPieceTrainer(vocab_size=400, special_tokens=list(specials)))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
        **({"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]} if segment_ids else {}),
    )


def bpe_tokenizer(*, padding_side: str = "right", max_length: int = 128) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer that appends an end-of-text token, as decoder embedders do."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[("<|endoftext|>", eos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        padding_side=padding_side,
        model_max_length=max_length,
    )


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def st_layout(
    root: Path,
    *,
    pooling: str,
    hidden: int,
    normalize: bool,
    max_seq_length: int,
    dense: tuple[int, str] | None = None,
    prompts: dict[str, str] | None = None,
    include_prompt: bool = True,
    similarity: str | None = None,
    truncate_dim: int | None = None,
) -> None:
    """Write the sentence-transformers module files around a saved transformer in `root`;
    `similarity` and `truncate_dim` go to config_sentence_transformers.json when given."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    write_json(
        root / "1_Pooling" / "config.json",
        {"word_embedding_dimension": hidden, "pooling_mode": pooling, "include_prompt": include_prompt},
    )
    if dense is not None:
        out_features, activation = dense
        layer = torch.nn.Linear(hidden, out_features)
        torch.nn.init.normal_(layer.weight, std=0.2)
        from safetensors.torch import save_file

        (root / "2_Dense").mkdir()
        save_file(
            {"linear.weight": layer.weight.detach(), "linear.bias": layer.bias.detach()},
            root / "2_Dense" / "model.safetensors",
        )
        write_json(
            root / "2_Dense" / "config.json",
            {"in_features": hidden, "out_features": out_features, "bias": True, "activation_function": activation},
        )
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    if normalize:
        modules.append(
            {
                "idx": len(modules),
                "name": str(len(modules)),
                "path": "3_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    write_json(root / "modules.json", modules)
    write_json(root / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    extra: dict[str, Any] = {"prompts": prompts or {}, "default_prompt_name": None}
    if similarity is not None:
        extra["similarity_fn_name"] = similarity
    if truncate_dim is not None:
        extra["truncate_dim"] = truncate_dim
    write_json(root / "config_sentence_transformers.json", extra)


def bert_weights(root: Path, *, seed: int = 0) -> Path:
    """A random 2-layer BERT (hidden 32) and its WordPiece tokenizer, in transformers' layout only."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = wordpiece_tokenizer()
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def tiny_bert(
    root: Path,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    dense: tuple[int, str] | None = None,
    prompts: dict[str, str] | None = None,
    include_prompt: bool = True,
    max_seq_length: int = 64,
    similarity: str | None = None,
    truncate_dim: int | None = None,
    seed: int = 0,
) -> Path:
    """A 2-layer BERT (hidden 32) in the sentence-transformers layout."""
    bert_weights(root, seed=seed)
    st_layout(
        root,
        pooling=pooling,
        hidden=32,
        normalize=normalize,
        max_seq_length=max_seq_length,
        dense=dense,
        prompts=prompts,
        include_prompt=include_prompt,
        similarity=similarity,
        truncate_dim=truncate_dim,
    )
    return root


def tiny_qwen2(root: Path, *, padding_side: str = "left", st: bool = True, seed: int = 0) -> Path:
    """A 2-layer Qwen2 decoder embedder with last-token pooling."""
    from transformers import Qwen2Config, Qwen2Model

    torch.manual_seed(seed)
    tokenizer = bpe_tokenizer(padding_side=padding_side)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2Model(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    if st:
        st_layout(root, pooling="lasttoken", hidden=32, normalize=True, max_seq_length=64)
    return root
