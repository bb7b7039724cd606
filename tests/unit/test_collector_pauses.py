"""The garbage collector's pauses in `/metrics`: every collection, in its generation's histogram."""

from __future__ import annotations

import gc

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infinity_server.metrics import Metrics


def pause_samples(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    """(sample name, generation, le) -> value of `infinity_gc_pause_seconds`."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, s.labels["generation"], s.labels.get("le", "")): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "infinity_gc_pause_seconds"
        for s in family.samples
    }


def test_each_collection_is_counted_in_its_generation_while_watched_and_only_then() -> None:
    metrics = Metrics()
    gc.disable()  # only the collections this test makes
    try:
        before = [s["collections"] for s in gc.get_stats()]
        with metrics.watching_the_collector():
            for generation in (0, 1, 2, 2):
                gc.collect(generation)
            after = [s["collections"] for s in gc.get_stats()]
        gc.collect()  # after the watch: not counted
    finally:
        gc.enable()
    samples = pause_samples(metrics)
    made = [a - b for a, b in zip(after, before, strict=True)]
    assert made == [1, 1, 2]  # the collector's own count, not the hook's
    for generation, count in enumerate(made):
        g = str(generation)
        assert samples[("infinity_gc_pause_seconds_count", g, "")] == count
        assert samples[("infinity_gc_pause_seconds_bucket", g, "+Inf")] == count
        buckets = [v for (name, gen, le), v in samples.items() if name.endswith("_bucket") and gen == g]
        assert buckets == sorted(buckets)
        assert samples[("infinity_gc_pause_seconds_sum", g, "")] > 0
    assert gc.callbacks.count(metrics.collector_pauses) == 0
