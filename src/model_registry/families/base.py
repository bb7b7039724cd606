"""What a family declares: its `Family`, and the detection `Rule`s over a directory's `Facts`.

Nothing here imports an adapter or an engine: declarations are read to detect a model's files
before anything heavy is imported (a light install has no torch at all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from model_registry.types import Capability, Kind
from model_registry.zoo.files import remote_classes

Stage = Literal["layout", "code", "kind", "family"]
STAGES: tuple[Stage, ...] = ("layout", "code", "kind", "family")


@dataclass(frozen=True)
class Facts:
    """What the rules read: a directory's files, and the entry's settings that bear on them."""

    root: Path
    transformer_dir: Path
    config: dict[str, Any]
    #: modules.json's module types, in order (empty without sentence-transformers modules).
    module_types: tuple[str, ...] = ()
    trusted: bool = False
    #: The LLM reranker keys (`template`, ...) the entry sets.
    rerank_keys: tuple[str, ...] = ()
    #: The configured kind, or the detected one once the kind stage has run.
    kind: Kind | None = None
    #: The names of the PEFT adapters the entry lists.
    adapters: tuple[str, ...] = ()
    #: The entry's `base_model`: the base of a PEFT adapter directory.
    base_model: str | None = None

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def architectures(self) -> tuple[str, ...]:
        return tuple(str(a) for a in self.config.get("architectures") or ())

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules' class names (`Transformer`, `Pooling`, `Dense`, ...)."""
        return tuple(t.rsplit(".", 1)[-1] for t in self.module_types)

    def has(self, name: str, *, inside: bool = False) -> bool:
        return ((self.transformer_dir if inside else self.root) / name).is_file()

    def remote_classes(self) -> list[str]:
        return remote_classes(self.config, self.module_types)

    def kind_name(self) -> str:
        return self.kind.value if self.kind else "auto"


@dataclass(frozen=True)
class Rule:
    """`when` the files say so, the rule decides: `kind` (a kind, or how to read it from the
    files), `family`, `remote` (code stage: whether the checkpoint's own code runs, with the
    `note` `/models` shows), or `refusal` (the message of the start-up error).

    Within a stage the rules are tried by `order`, lowest first (declaration order among equals);
    the first that matches decides."""

    name: str
    stage: Stage
    when: Callable[[Facts], bool]
    #: What follows, as `docs/text-zoo.md` says it.
    says: str
    order: int = 50
    kind: Kind | Callable[[Facts], Kind] | None = None
    family: str | None = None
    remote: bool | None = None
    #: Code stage: transformers' native port runs the model (`families.ports`).
    port: bool = False
    note: Callable[[Facts], str] | None = None
    refusal: Callable[[Facts], str] | None = None

    def kind_of(self, facts: Facts) -> Kind:
        assert self.kind is not None, f"This is a bug: rule {self.name} decides no kind"
        return self.kind if isinstance(self.kind, Kind) else self.kind(facts)


@dataclass(frozen=True)
class Family:
    """One model family: what serves it, what it can do and how its files are recognised.

    Detection, the adapter and capability tables, the media kinds, `/models`' facts and the docs'
    family table are read from these declarations (`model_registry.families`)."""

    name: str
    #: The kind it serves (None: its parts', a Router's routes').
    kind: Kind | None
    #: "module:Class" of its adapter, imported when a model of the family is created; the class
    #: takes (layout, trust_remote_code).
    adapter: str
    capabilities: frozenset[Capability]
    #: One line for the docs' family table.
    summary: str
    #: The implementation its parity tests compare with.
    reference: str
    rules: tuple[Rule, ...] = ()
    #: Serves its kind wherever no family rule names another family.
    default: bool = False
    #: Computed on numpy and tokenizers alone: no engine, no torch, no transformers imported.
    engineless: bool = False
    #: config.json's `model_type`s and `architectures` that make a model this family's media kind.
    model_types: frozenset[str] = frozenset()
    architectures: frozenset[str] = frozenset()
    #: "module:function" building the Layout of a directory a layout-stage rule claims for it.
    layout: str | None = None
    #: The engines that serve it, as the docs' table lists them.
    engines: tuple[str, ...] = ("torch",)
    #: "module:Class" of the adapter that serves it where torch is not installed (None: it needs
    #: torch): on the model's own ONNX graph, with ONNX Runtime, tokenizers and numpy alone.
    without_torch: str | None = None

    def __post_init__(self) -> None:
        for rule in self.rules:
            claims = rule.refusal is None and rule.stage in ("layout", "family")
            if claims and rule.family != self.name:
                raise ValueError(f"family '{self.name}': rule '{rule.name}' claims family '{rule.family}'")
            if rule.stage == "layout" and rule.refusal is None and self.layout is None:
                raise ValueError(f"family '{self.name}': layout rule '{rule.name}' needs the family's `layout`")
