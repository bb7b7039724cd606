"""A dense embedder with the entry's LoRA adapters in PEFT's format (`adapters: {name: directory}`),
one chosen per request (`adapter`, else the entry's `options.default_adapter`, else none) and
applied to its batches on torch (`task_lora`); each adapter's factors are stacked on the base
model's layers, so adapters share one copy of the model and count in its memory."""

from __future__ import annotations

from typing import Any

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.task_lora import TaskLoraAdapter
from model_registry.backends.choice import Choice
from model_registry.backends.torch import engine as backend
from model_registry.backends.torch import lora
from model_registry.detection.layout import Layout
from model_registry.errors import ModelUnavailable
from model_registry.families.peft_lora import adapter_directory


class PeftLoraAdapter(TaskLoraAdapter):
    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.tasks = tuple(layout.adapters)
        self.task_prompts = {}
        chosen = layout.options.get("default_adapter")
        if chosen is not None and chosen not in self.tasks:
            raise ModelUnavailable(f"default_adapter '{chosen}' is not one of the adapters: {', '.join(self.tasks)}")
        self.default_task = None if chosen is None else str(chosen)

    def engine_choices(self, options: LoadOptions, device: str) -> tuple[Choice, ...]:
        # The entry's checks allow torch or auto alone; auto takes torch, the engine that applies them.
        return (Choice("torch", "configured" if options.backend == "torch" else "auto: torch, which applies adapters"),)

    def load(self, options: LoadOptions) -> None:
        super().load(options)
        engine = self.engine
        assert isinstance(engine, backend.TorchEngine), "This is a bug: adapters loaded on another engine"
        root = self.layout.root
        directories = [(name, adapter_directory(root, path)) for name, path in self.layout.adapters.items()]
        missing = [f"{name} ({path})" for name, path in directories if not path.is_dir()]
        if missing:
            raise ModelUnavailable(f"adapter directories not found: {', '.join(missing)}")
        before = engine.footprint()
        self.selection = lora.install_peft(engine.model, directories)
        self._footprint += engine.footprint() - before

    def family_facts(self) -> dict[str, Any]:
        return {**super().family_facts(), "adapters": list(self.tasks)}
