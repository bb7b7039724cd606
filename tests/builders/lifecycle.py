"""Model entries for lifecycle tests: fake models of known sizes, and budgets in whole models."""

from __future__ import annotations

from typing import Any

MIB = 2**20


def fake_model(name: str, mib: int = 10, **options: Any) -> dict[str, Any]:
    """A fake model that declares `mib` MiB (and really holds them when `allocate=True`)."""
    entry: dict[str, Any] = {"name": name, "source": "fake", "kind": "fake", "options": {"footprint": mib * MIB}}
    for key in ("pin", "keep_alive", "max_queued_items"):
        if key in options:
            entry[key] = options.pop(key)
    entry["options"].update(options)
    return entry


def budget_for(models: int, mib: int = 10) -> int:
    """Bytes that hold `models` models of `mib` MiB with half a model to spare, never a whole one."""
    return int((models + 0.5) * mib * MIB)
