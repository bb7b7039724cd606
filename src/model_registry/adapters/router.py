"""sentence-transformers' Router: one module chain per route, an input sent down one of them.

Asymmetric models keep one chain for queries and another for documents: the inference-free
sparse models (an IDF table for queries, SPLADE for documents), or dense pairs of a light query
encoder and a heavier document encoder. Each route is detected as a model of its own and served
by its own adapter; a request's route is the task it names (`EmbedItem.task`: the prompt name or
role "query" or "document" picks it, as `encode_query` and `encode_document` do), else the
Router's default route, resolved as the Router resolves a text input (`route_mappings`, then a
route of the task's name, then `default_route`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.adapters.static import ENGINE
from model_registry.detection.layout import Layout
from model_registry.errors import InvalidInput, ModelUnavailable
from model_registry.types import EmbedItem, Item, Prepared, Result

#: The prompts `encode_document` tries, in order, for a document (`encode_query` takes "query").
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")


class RouterAdapter(Adapter):
    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        from model_registry.adapters import adapter_for

        self.layout = layout
        self.routes: dict[str, Adapter] = {name: adapter_for(sub) for name, sub in layout.routes.items()}
        self._names = tuple(self.routes)
        self.kind = layout.kind
        self.capabilities = frozenset().union(*(a.capabilities for a in self.routes.values()))
        self.similarity = layout.similarity
        self.prompts = dict(layout.prompts)
        self.default_prompt_name = layout.default_prompt_name
        mapped = [task for task, _ in layout.route_mappings if task is not None]
        self.tasks = tuple(dict.fromkeys([*self._names, *mapped]))
        self.task_prompts = {task: self._task_prompt(task) for task in self.tasks}
        self.token_caps = all(a.token_caps for a in self.routes.values())
        sides = [a.truncation_sides for a in self.routes.values()]
        self.truncation_sides = tuple(s for s in sides[0] if all(s in other for other in sides))
        engines = [a for a in self.routes.values() if a.backend != ENGINE]
        self.backend = ENGINE if not engines else engines[0].backend
        self.max_length = self._widest("max_length")
        self.computes_inline = all(a.computes_inline for a in self.routes.values())

    def _task_prompt(self, task: str) -> str:
        """The prompt `encode_query` / `encode_document` put before a text of `task`: the model's
        prompt of that name (for a document, its first of document, passage, corpus), else none."""
        names = _DOCUMENT_PROMPTS if task == "document" else (task,)
        return next((self.prompts[n] for n in names if n in self.prompts), "")

    def route(self, task: str | None) -> str:
        """The route a text input of `task` (None: none named) takes, as the Router resolves it."""
        mappings = self.layout.route_mappings
        for key in ((task, "text"), (task, None), (None, "text"), (None, None)):
            if key in mappings:
                return mappings[key]
        if task is not None and task in self.routes:
            return task
        if "text" in self.routes:
            return "text"
        if task is not None:
            raise InvalidInput(f"no route for the task '{task}'; this model's routes: {', '.join(self.tasks)}")
        if self.layout.default_route is None:
            raise InvalidInput(
                f"this model has no default route: name one with prompt_name or input_type ({', '.join(self.tasks)})",
                param="prompt_name",
            )
        return self.layout.default_route

    # ---- loading -------------------------------------------------------------------------------

    def _options(self, adapter: Adapter, options: LoadOptions) -> LoadOptions:
        """A route's load options: the engine settings go to the routes that run an engine; a
        route on numpy takes its own (unless no route runs an engine: then it refuses them)."""
        if adapter.backend != ENGINE or self.backend == ENGINE:
            return options
        return replace(options, backend="auto", quantize="none", dtype="auto", device="cpu", cuda_graphs="auto")

    def build(self, options: LoadOptions) -> None:
        for adapter in self.routes.values():
            adapter.build(self._options(adapter, options))

    def load(self, options: LoadOptions) -> None:
        loaded: list[Adapter] = []
        try:
            for adapter in self.routes.values():
                adapter.load(self._options(adapter, options))
                loaded.append(adapter)
        except BaseException:
            for adapter in loaded:
                adapter.unload()
            raise
        widths = {name: a.dimensions for name, a in self.routes.items()}
        if len(set(widths.values())) > 1:
            self.unload()
            said = ", ".join(f"'{name}' {width}" for name, width in widths.items())
            raise ModelUnavailable(
                f"{self.layout.root}: the Router's routes answer vectors of different widths ({said})"
            )
        engine = next((a for a in self.routes.values() if a.backend != ENGINE), None)
        shown = engine or self.routes[self._names[0]]
        self.backend = ENGINE if engine is None else engine.backend
        self.dimensions, self.device, self.dtype = next(iter(widths.values())), shown.device, shown.dtype
        self.max_length = self._widest("max_length")

    def _widest(self, name: str) -> int | None:
        values = [getattr(a, name) for a in self.routes.values()]
        return None if any(v is None for v in values) else max(values)

    def on_forward_thread(self) -> None:
        for adapter in self.routes.values():
            adapter.on_forward_thread()

    def unload(self) -> None:
        for adapter in self.routes.values():
            adapter.unload()

    def estimate(self, options: LoadOptions) -> int | None:
        known = [a.estimate(self._options(a, options)) for a in self.routes.values()]
        return None if all(k is None for k in known) else sum(k for k in known if k is not None)

    def footprint(self) -> int:
        return sum(a.footprint() for a in self.routes.values())

    # ---- serving -------------------------------------------------------------------------------

    def prepare(self, items: Sequence[Item]) -> list[Prepared]:
        where: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            where.setdefault(self.route(item.task if isinstance(item, EmbedItem) else None), []).append(i)
        prepared: list[Prepared] = []
        for name, indices in where.items():
            number = self._names.index(name)
            for p in self.routes[name].prepare([items[i] for i in indices]):
                # the route's index rides in the group: the queue never batches two routes together
                prepared.append(replace(p, index=indices[p.index], group=f"{number}:{p.group}"))
        prepared.sort(key=lambda p: p.index)
        return prepared

    def collate(self, items: Sequence[Prepared]) -> tuple[Adapter, Any]:
        number, _, _ = items[0].group.partition(":")
        adapter = self.routes[self._names[int(number)]]
        return adapter, adapter.collate([replace(p, group=p.group.partition(":")[2]) for p in items])

    def forward(self, batch: tuple[Adapter, Any]) -> Any:
        adapter, inner = batch
        return adapter.forward(inner)

    def postprocess(self, batch: tuple[Adapter, Any], output: Any) -> list[Result]:
        adapter, inner = batch
        return adapter.postprocess(inner, output)

    def batch_cost(self, count: int, longest: int, total: int) -> int:
        # the dearest route's price: the queue does not say which route a batch is of
        return max(a.batch_cost(count, longest, total) for a in self.routes.values())

    def text_tokenizer(self) -> Any:
        default = self.layout.default_route
        ordered = [self.routes[default]] if default is not None else []
        return next((t for a in [*ordered, *self.routes.values()] if (t := a.text_tokenizer()) is not None), None)

    def describe(self) -> dict[str, Any]:
        described = {name: a.describe() for name, a in self.routes.items()}
        engine = next((d["engine"] for d in described.values() if d.get("engine", {}).get("backend") != ENGINE), None)
        default = described.get(self.layout.default_route or self._names[0], {})
        facts: dict[str, Any] = {
            "prompts": sorted(self.prompts),
            "default_prompt_name": self.default_prompt_name,
            "router": {
                "default_route": self.layout.default_route,
                "tasks": list(self.tasks),
                "route_mappings": {str(k): v for k, v in self.layout.route_mappings.items()},
                "routes": described,
            },
        }
        if "normalize" in default:
            facts["normalize"] = default["normalize"]
        facts["engine"] = engine or default.get("engine")
        return {**facts, **self.layout.notes}
