"""A model's tokenizer read from its files with the `tokenizers` library alone, for the install
without transformers (`adapters.onnx_text`).

It answers the questions `TextTokenizer` asks of transformers' fast tokenizer (padding and
truncation sides, special tokens and their ids, the length limit, decoding) from the same files
transformers reads: `tokenizer.json` (the Rust pipeline itself, run as it is),
`tokenizer_config.json` and `special_tokens_map.json`. A checkpoint whose tokenizing transformers
would change at load (`add_eos_token` rewriting the post-processor, no `tokenizer.json` to run) is
refused here rather than tokenized unlike its reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model_registry.errors import ModelUnavailable

#: The named special tokens, as transformers lists them (`SPECIAL_TOKENS_ATTRIBUTES`).
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_EXTRA = ("additional_special_tokens", "extra_special_tokens")


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as error:
        raise ModelUnavailable(f"cannot read {path.name} in {path.parent}: {error}") from error
    return data if isinstance(data, dict) else {}


def _content(token: Any) -> str | None:
    """A token as the files write it: a string, or an AddedToken's dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


class FileTokenizer:
    """The parts of a transformers fast tokenizer that `TextTokenizer` reads, from the files."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ModelUnavailable(
                f"{directory} has no tokenizer.json, which the install without transformers needs; "
                "install the project with its 'torch' extra: pip install 'infinity-server[torch]'"
            )
        settings = _json(directory / "tokenizer_config.json")
        if settings.get("add_eos_token") is True or settings.get("add_bos_token") is True:
            raise ModelUnavailable(
                f"{directory}: tokenizer_config.json asks for add_bos_token/add_eos_token, which transformers "
                "applies by rewriting the tokenizer; install the project with its 'torch' extra: "
                "pip install 'infinity-server[torch]'"
            )
        self.backend_tokenizer = Tokenizer.from_file(str(path))
        self.padding_side = str(settings.get("padding_side") or "right")
        self.truncation_side = str(settings.get("truncation_side") or "right")
        self.split_special_tokens = bool(settings.get("split_special_tokens", False))
        limit = settings.get("model_max_length")
        self.model_max_length = limit if isinstance(limit, int) else None
        named = {**_json(directory / "special_tokens_map.json"), **settings}
        self._named = {key: _content(named.get(key)) for key in _NAMED}
        extra = [_content(t) for key in _EXTRA for t in (named.get(key) or [])]
        tokens = [t for t in (*self._named.values(), *extra) if t is not None]
        ids = (self.backend_tokenizer.token_to_id(t) for t in tokens)
        self.all_special_ids = sorted({i for i in ids if i is not None})

    def _id(self, name: str) -> int | None:
        token = self._named[name]
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos_token")

    def __len__(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        processor = self.backend_tokenizer.post_processor
        return 0 if processor is None else int(processor.num_special_tokens_to_add(pair))

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        token: str | None = self.backend_tokenizer.id_to_token(token_id)
        return token

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
