"""A loaded model is left out of the cyclic collector's walks, and its cycles still go at its unload."""

from __future__ import annotations

import asyncio
import gc
import weakref

from model_registry import Registry
from tests.builders.lifecycle import budget_for, fake_model


class Node:
    """One end of a reference cycle: only the cyclic collector can free it."""

    peer: Node


def tracked(target: object) -> bool:
    """Whether the collector's generations hold `target` (frozen objects are in none of them)."""
    return any(o is target for o in gc.get_objects())


def test_a_loaded_model_is_frozen_out_of_collections_and_its_cycles_are_collected_at_its_unload() -> None:
    config = {"models": [fake_model("a"), fake_model("b")], "memory_budget": budget_for(2)}

    async def scenario() -> None:
        async with Registry.from_config(config) as registry:
            await registry.load("b")
            for _ in range(5):  # the unload races thread-pool threads that held the model: repeated
                # A reference cycle made before the load and held by the model (as a module
                # tree's parent links are): alive when the load freezes the heap.
                cycle = Node()
                cycle.peer = Node()
                cycle.peer.peer = cycle
                await registry.load("a")
                adapter = registry._handles["a"].adapter
                assert adapter is not None
                assert not tracked(adapter)
                assert not tracked(cycle)
                adapter.held = cycle  # type: ignore[attr-defined]
                cycle_gone, adapter_gone = weakref.ref(cycle), weakref.ref(adapter)
                del adapter, cycle
                assert cycle_gone() is not None

                await registry.unload("a")
                # The adapter itself is held by its worker's reference cycle with its queue.
                assert adapter_gone() is None, "the unloaded model was left in the frozen heap"
                assert cycle_gone() is None, "the unloaded model's reference cycle was left in the frozen heap"
                assert gc.get_freeze_count() > 0, "what survives the unload's collection is frozen again"
                assert not tracked(registry._handles["b"].adapter)
                assert (await registry.embed("b", ["still serving"])).items

    asyncio.run(scenario())


def test_a_load_leaves_the_frozen_heap_alone_and_the_next_unload_walks_it() -> None:
    config = {"models": [fake_model("a"), fake_model("b")], "memory_budget": budget_for(2)}

    async def scenario() -> None:
        async with Registry.from_config(config) as registry:
            await registry.load("b")
            # Cyclic garbage that was frozen while alive: only a walk over the frozen heap frees it.
            cycle = Node()
            cycle.peer = Node()
            cycle.peer.peer = cycle
            gc.freeze()
            cycle_gone = weakref.ref(cycle)
            del cycle
            await registry.load("a")
            assert cycle_gone() is not None, "a load walked the whole frozen heap"
            await registry.unload("a")
            assert cycle_gone() is None, "an unload left cyclic garbage in the frozen heap"

    asyncio.run(scenario())
