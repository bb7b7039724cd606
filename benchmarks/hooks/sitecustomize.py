"""Applies `standin.py`'s stand-ins in a server started by a benchmark, from the environment."""

import os

if os.environ.get("BENCH_STAND_IN") or os.environ.get("BENCH_WITHOUT_FREEZE") or os.environ.get("BENCH_GC_THRESHOLDS"):
    import standin

    if os.environ.get("BENCH_STAND_IN"):
        standin.stand_in(float(os.environ["BENCH_STAND_IN"]))
    if os.environ.get("BENCH_WITHOUT_FREEZE"):
        standin.without_freeze()
    if os.environ.get("BENCH_GC_THRESHOLDS"):
        standin.collector_thresholds(os.environ["BENCH_GC_THRESHOLDS"])
