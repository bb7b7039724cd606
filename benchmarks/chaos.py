"""Chaos: a flood at ten times the measured capacity, mixed with small queries and malformed requests.

    python benchmarks/chaos.py [--seconds 180] [--factor 10] [--deadline 10] [--inputs 64]

Against a server process serving the bundled all-MiniLM-L6-v2 on a loopback port:
1. capacity: bulk requests of `--inputs` texts, two at a time, for a few seconds -> requests/s;
2. flood: for `--seconds`, bulk requests arrive at `--factor` x capacity (open loop: arrivals do
   not wait for answers), with one-sentence queries asking for `--small-share` of the server's
   time (at most 5 a second) and a malformed request every 0.5 s (broken JSON, a text/plain
   body, wrong types, an empty input, an unknown model);
3. recovery: once arrivals stop, how long until a small query is answered as fast as before.
Prints the status mix per kind of request, the share answered after their deadline (target 0),
the small queries' p50/p99, the server's peak RSS and the recovery time, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from lib.machine import cpu_model
from lib.rawhttp import Answer, encode, send
from lib.serving import free_port, start_server

MIB = 2**20
SENTENCE = "A man is playing a guitar on a small stage while people listen."


@dataclass
class Tally:
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    late: int = 0

    def add(self, kind: str, answer: Answer, deadline: float) -> None:
        self.statuses[kind][answer.status] += 1
        self.seconds[kind].append(answer.seconds)
        self.late += answer.seconds > deadline


class PeakRss:
    """The highest RSS of process `pid`, sampled every 50 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.start = self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def malformed(url: str) -> list[bytes]:
    path = "/v1/embeddings"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    return [
        head.encode() + b"Content-Length: 9\r\n\r\n{not json",
        encode(url, path, {"model": "all-MiniLM-L6-v2", "input": ["x"]}, content_type="text/plain"),
        encode(url, path, {"model": "all-MiniLM-L6-v2", "input": [1.5, {"a": 1}]}),
        encode(url, path, {"model": "all-MiniLM-L6-v2", "input": []}),
        encode(url, path, {"model": "no-such-model", "input": ["x"]}),
    ]


async def capacity(url: str, bulk: bytes, seconds: float) -> float:
    """Bulk requests per second with two in flight (one runs while the next is prepared)."""
    done = 0
    stop = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < stop:
            answer = await send(url, bulk)
            done += answer.status == 200

    started = time.monotonic()
    await asyncio.gather(loop(), loop())
    return done / (time.monotonic() - started)


async def arrivals(rate: float, until: float, make: object) -> list[asyncio.Task[None]]:
    """Start `make()` `rate` times a second until `until`, without waiting for the answers."""
    tasks, period, next_at = [], 1.0 / rate, time.monotonic()
    while next_at < until:
        tasks.append(asyncio.ensure_future(make()))  # type: ignore[operator]
        next_at += period
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return tasks


async def recovery(url: str, small: bytes, normal: float, limit: float = 120.0) -> float:
    """Seconds until three small queries in a row are answered 200 within twice `normal`."""
    started, streak = time.monotonic(), 0
    while streak < 3 and time.monotonic() - started < limit:
        answer = await send(url, small)
        streak = streak + 1 if answer.status == 200 and answer.seconds <= 2 * normal else 0
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def flood(url: str, args: argparse.Namespace, pid: int) -> None:
    bulk = encode(url, "/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": [SENTENCE] * args.inputs})
    small = encode(url, "/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": [SENTENCE]})
    bad = malformed(url)
    per_second = await capacity(url, bulk, args.measure)
    normal = float(np.median([(await send(url, small)).seconds for _ in range(20)]))
    alone = f"a small query alone: {1000 * normal:.1f} ms"
    print(f"capacity: {per_second:.2f} bulk requests/s of {args.inputs} texts; {alone}")
    tally, rss = Tally(), PeakRss(pid)
    counter = iter(range(10**9))

    async def one(kind: str, request: bytes) -> None:
        tally.add(kind, await send(url, request, timeout=args.deadline + 30), args.deadline)

    until = time.monotonic() + args.seconds
    streams = await asyncio.gather(
        arrivals(args.factor * per_second, until, lambda: one("bulk", bulk)),
        arrivals(min(5.0, args.small_share / normal), until, lambda: one("small", small)),
        arrivals(2.0, until, lambda: one("malformed", bad[next(counter) % len(bad)])),
    )
    recovered = await recovery(url, small, normal)
    await asyncio.gather(*(t for stream in streams for t in stream))
    rss.stop()
    report(tally, args, rss, recovered)


def report(tally: Tally, args: argparse.Namespace, rss: PeakRss, recovered: float) -> None:
    total = sum(sum(c.values()) for c in tally.statuses.values())
    for kind, statuses in sorted(tally.statuses.items()):
        print(f"{kind:>10}: {sum(statuses.values()):6d} requests, statuses {dict(sorted(statuses.items()))}")
    small = tally.seconds["small"]
    print(
        f"answered after their {args.deadline:g}s deadline: {tally.late} of {total} ({100 * tally.late / total:.2f}%)"
    )
    print(f"small queries: p50 {1000 * np.percentile(small, 50):.0f} ms, p99 {1000 * np.percentile(small, 99):.0f} ms")
    print(f"server RSS: {rss.start / MIB:.0f} MiB at the start, peak {rss.peak / MIB:.0f} MiB")
    print(f"recovery after the flood: {recovered:.2f} s")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {cpu_model()}; load average {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="how long the flood lasts")
    parser.add_argument("--factor", type=float, default=10.0, help="bulk arrivals as a multiple of capacity")
    parser.add_argument("--deadline", type=float, default=10.0, help="the server's request_timeout")
    parser.add_argument("--inputs", type=int, default=64, help="texts per bulk request")
    parser.add_argument("--measure", type=float, default=5.0, help="seconds spent measuring capacity")
    parser.add_argument(
        "--small-share", type=float, default=0.3, help="share of the server's time small queries ask for (at most 5/s)"
    )
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        config = {"server": {"request_timeout": args.deadline}}
        server = start_server(config, Path(workdir), port)
        try:
            asyncio.run(flood(f"http://127.0.0.1:{port}", args, server.pid))
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
