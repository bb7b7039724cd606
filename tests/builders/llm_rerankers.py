"""Tiny random LLM rerankers in their original (causal LM) layouts, saved as the real ones ship.

- `tiny_qwen3_reranker`: Qwen3ForCausalLM with tied embeddings and a Qwen-style byte-level BPE
  tokenizer whose vocabulary has "yes" and "no" and the ChatML special tokens (Qwen3-Reranker).
- `tiny_gemma_reranker`: GemmaForCausalLM with a Gemma-style tokenizer (`<bos>` added, "Yes" in
  the vocabulary, `▁` for spaces): bge-reranker-v2-gemma.
- `tiny_mxbai_reranker`: Qwen2ForCausalLM with an untied LM head: mxbai-rerank-v2.
- `with_chat_template`: a reranker chat template with `query`/`document` roles, as
  sentence-transformers 6 renders a pair for a causal LM.

Weights are drawn wider than the configs' default so that scores spread across pairs.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from tests.builders.text import CORPUS

#: Lines that start with the scoring words, so that BPE learns each as one token; and questions and
#: sentences ending a line, so that it learns punctuation merged with the newline after it (as the
#: real vocabularies hold "?\n" and ".\n"), where tokenizing a prompt whole and in pieces differ.
ANSWERS = ["yes it is", "no it is not", "Yes", "No", "yes", "no", "1", "0"] * 20
ENDINGS = ["Which one?\nB: it is.\nGiven", "Where?\ndocument: here.\nYou", "query: why?\n", "It is.\n"] * 30
#: Qwen2's pre-tokenizer split: ` ?[^\s\p{L}\p{N}]+[\r\n]*` keeps "?\n" in one piece.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
TINY: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "initializer_range": 0.3,
}
#: A reranker's chat template with the pair's roles; an instruction comes as a system message.
PAIR_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document is relevant to the Query. "
    'Answer only "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    '{%- for m in messages if m.role == "system" %}<Instruct>: {{ m.content }}\n{% endfor -%}'
    '<Query>: {{ (messages | selectattr("role", "eq", "query") | first).content }}\n'
    '<Document>: {{ (messages | selectattr("role", "eq", "document") | first).content }}<|im_end|>\n'
    "<|im_start|>assistant\n"
)


def qwen_tokenizer(*, padding_side: str = "left", max_length: int = 512) -> PreTrainedTokenizerFast:
    """Byte-level BPE as Qwen2's (its split, then bytes): no special tokens added on encoding,
    `<|endoftext|>` pads."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=QWEN_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 5 + ANSWERS + ENDINGS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIALS[1:],
        padding_side=padding_side,
        model_max_length=max_length,
    )


def gemma_tokenizer(*, padding_side: str = "left", max_length: int = 512) -> PreTrainedTokenizerFast:
    """SentencePiece-style BPE as Gemma's: `▁` for spaces, `<bos>` added in front of a text."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Metaspace(prepend_scheme="never")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    alphabet = sorted(set(string.ascii_letters + string.digits + string.punctuation) | {"\n", "▁"})
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet)
    tok.train_from_iterator(CORPUS * 5 + ANSWERS + ENDINGS, trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B:1", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side=padding_side,
        model_max_length=max_length,
    )


def _save(model: Any, tokenizer: PreTrainedTokenizerFast, root: Path) -> Path:
    model.eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def tiny_qwen3_reranker(root: Path, *, padding_side: str = "left", seed: int = 0, max_length: int = 512) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    tokenizer = qwen_tokenizer(padding_side=padding_side, max_length=max_length)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        head_dim=16,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        **TINY,
    )
    return _save(Qwen3ForCausalLM(config), tokenizer, root)


def tiny_gemma_reranker(root: Path, *, padding_side: str = "left", seed: int = 0) -> Path:
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(seed)
    tokenizer = gemma_tokenizer(padding_side=padding_side)
    config = GemmaConfig(
        vocab_size=len(tokenizer),
        head_dim=16,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **TINY,
    )
    return _save(GemmaForCausalLM(config), tokenizer, root)


def tiny_mxbai_reranker(root: Path, *, padding_side: str = "left", seed: int = 0) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    tokenizer = qwen_tokenizer(padding_side=padding_side)
    config = Qwen2Config(
        vocab_size=len(tokenizer), tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, **TINY
    )
    return _save(Qwen2ForCausalLM(config), tokenizer, root)


def with_chat_template(root: Path, template: str = PAIR_TEMPLATE) -> Path:
    """The directory with `template` as its chat template (`chat_template.jinja`)."""
    (root / "chat_template.jinja").write_text(template, encoding="utf-8")
    return root


def tiny_qwen3_embedding(root: Path, *, seed: int = 0) -> Path:
    """Qwen3-Embedding's layout: `Qwen3ForCausalLM` in config.json but the bare model's weights,
    and sentence-transformers modules (last-token pooling, normalised) that say it embeds."""
    import json

    from transformers import Qwen3Config, Qwen3Model

    from tests.builders.text import st_layout

    torch.manual_seed(seed)
    tokenizer = qwen_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), head_dim=16, pad_token_id=tokenizer.pad_token_id, **TINY)
    _save(Qwen3Model(config), tokenizer, root)
    saved = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**saved, "architectures": ["Qwen3ForCausalLM"]}))
    st_layout(root, pooling="lasttoken", hidden=32, normalize=True, max_seq_length=64)
    return root
