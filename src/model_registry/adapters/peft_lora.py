"""A dense embedder with the entry's LoRA adapters in PEFT's format (`adapters: {name: directory}`),
one chosen per request (`adapter`) and applied to its batches on torch (`task_lora`); each adapter's
factors are stacked on the base model's layers, so adapters share one copy of the model and count
in its memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_registry.adapters.base import LoadOptions
from model_registry.adapters.task_lora import TaskLoraAdapter
from model_registry.backends.choice import Choice
from model_registry.backends.torch import engine as backend
from model_registry.backends.torch import lora
from model_registry.detection.layout import Layout
from model_registry.errors import ModelUnavailable


class PeftLoraAdapter(TaskLoraAdapter):
    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.tasks = tuple(layout.adapters)
        self.task_prompts = {}
        self.default_task = None

    def engine_choices(self, options: LoadOptions, device: str) -> tuple[Choice, ...]:
        # The entry's checks allow torch or auto alone; auto takes torch, the engine that applies them.
        return (Choice("torch", "configured" if options.backend == "torch" else "auto: torch, which applies adapters"),)

    def load(self, options: LoadOptions) -> None:
        super().load(options)
        engine = self.engine
        assert isinstance(engine, backend.TorchEngine), "This is a bug: adapters loaded on another engine"
        directories = [(name, Path(path).expanduser()) for name, path in self.layout.adapters.items()]
        missing = [f"{name} ({path})" for name, path in directories if not path.is_dir()]
        if missing:
            raise ModelUnavailable(f"adapter directories not found: {', '.join(missing)}")
        before = engine.footprint()
        self.selection = lora.install_peft(engine.model, directories)
        self._footprint += engine.footprint() - before

    def family_facts(self) -> dict[str, Any]:
        return {**super().family_facts(), "adapters": list(self.tasks)}
