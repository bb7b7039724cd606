"""Scale from zero, simulated with real processes: the gate (`infinity-server gate`) in front of a
group with no replica, and a controller that plays KEDA's metrics-api scaler and the Deployment:
it reads the group's figures from the gate as KEDA would and starts a replica process
(`infinity-server serve`) when requests are in the gate, stops it when told to scale to zero.

What a client sees: a request for a group at zero waits and is answered once the replica is up,
or gets a 503 with Retry-After when none comes within the gate's wait; never a connection error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import REPO, free_port

pytestmark = pytest.mark.integration

SERVER = REPO / ".venv" / "bin" / "infinity-server"
MODEL = {"name": "fake", "source": "fake", "kind": "fake"}
RETRY_AFTER = 7


def launch(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    pytest.fail(f"{url} never answered: {log.read_text()[-2000:]}")


class Controller:
    """KEDA's part: polls the gate's figures for the group; while requests are in the gate and no
    replica runs, starts one (activation); `scale_to_zero` stops it with SIGTERM, as a scale-down."""

    def __init__(self, gate: str, group: str, port: int, config: Path, log: Path) -> None:
        self.figures_url = f"{gate}/gate/groups/{group}"
        self.port, self.config, self.log = port, config, log
        self.replica: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.seen_waiting = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Controller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.scale_to_zero()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                figures = httpx.get(self.figures_url, timeout=1).json()
            except httpx.TransportError:
                figures = {}
            self.seen_waiting = max(self.seen_waiting, figures.get("waiting", 0))
            with self._lock:
                if figures.get("in_flight", 0) > 0 and self.replica is None:
                    command = [str(SERVER), "serve", "--config", str(self.config), "--port", str(self.port)]
                    self.replica = launch([*command, "--host", "127.0.0.1"], self.log)
                    self.starts += 1
            time.sleep(0.1)

    def scale_to_zero(self) -> None:
        with self._lock:
            if self.replica is not None:
                self.replica.send_signal(signal.SIGTERM)
                self.replica.wait(30)
                self.replica = None


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, str, int, Path]]:
    """A gate for two groups: `embed` (a replica port the controller serves) and `cold` (a port
    nothing will ever serve); the second gate waits only 1.5 s, for the 503."""
    replica_port = free_port()
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump({"models": [MODEL]}))
    gates: list[str] = []
    processes = []
    for wait in (60, 1.5):
        port = free_port()
        settings = {
            "gate": {
                "wait_seconds": wait,
                "retry_after": RETRY_AFTER,
                "max_body_bytes": 4096,
                "max_held_bytes": 3000,
                # the quick gate holds one waiting request per group, the other as many as it likes
                "max_waiting": 1 if wait < 60 else 1024,
                "groups": [
                    {"name": "embed", "url": f"http://127.0.0.1:{replica_port}", "models": ["fake"]},
                    {"name": "cold", "url": f"http://127.0.0.1:{free_port()}", "models": ["cold-model"]},
                ],
            }
        }
        path = tmp_path / f"gate-{port}.yaml"
        path.write_text(yaml.safe_dump(settings))
        log = tmp_path / f"gate-{port}.log"
        process = launch([str(SERVER), "gate", "--config", str(path), "--host", "127.0.0.1", "--port", str(port)], log)
        processes.append(process)
        gates.append(f"http://127.0.0.1:{port}")
        wait_for(f"{gates[-1]}/gate/health", process, log)
    try:
        yield gates[0], gates[1], replica_port, config
    finally:
        for process in processes:
            process.terminate()
            process.wait(15)


def embed(gate: str, model: str = "fake", **headers: str) -> httpx.Response:
    body = {"model": model, "input": ["a sentence"]}
    return httpx.post(f"{gate}/v1/embeddings", json=body, headers=headers, timeout=120)


def test_the_first_requests_after_zero_wait_for_the_replica_and_are_answered(
    setup: tuple[str, str, int, Path], tmp_path: Path
) -> None:
    gate, _, port, config = setup
    with Controller(gate, "embed", port, config, tmp_path / "replica.log") as controller:
        with ThreadPoolExecutor(4) as pool:
            # two name the model in the router's header, two only in the body
            answers = list(
                pool.map(lambda i: embed(gate, **({"X-Gateway-Model-Name": "fake"} if i % 2 else {})), range(4))
            )
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
        assert all(len(a.json()["data"][0]["embedding"]) > 0 for a in answers)
        assert controller.starts == 1
        assert controller.seen_waiting >= 1  # the requests waited in the gate while the replica started
        figures = httpx.get(f"{gate}/gate/groups/embed").json()
        assert figures == {"group": "embed", "ready": True, "waiting": 0, "in_flight": 0, "requests": 4}

        # scaled back to zero: the next request waits again, and a new replica answers it
        controller.scale_to_zero()
        again = embed(gate)
        assert again.status_code == 200, again.text
        assert controller.starts == 2
        metrics = httpx.get(f"{gate}/gate/metrics").text
        assert 'infinity_gate_requests_total{group="embed"} 5.0' in metrics


def test_a_group_that_never_starts_gets_503_with_retry_after(setup: tuple[str, str, int, Path]) -> None:
    _, quick, _, _ = setup
    started = time.monotonic()
    answer = embed(quick, "cold-model")
    waited = time.monotonic() - started
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == str(RETRY_AFTER)
    assert "no replica of group 'cold' was ready within 1.5 s" in answer.json()["error"]["message"]
    assert 1.4 < waited < 10
    assert httpx.get(f"{quick}/gate/health").status_code == 200
    assert 'infinity_gate_wait_timeouts_total{group="cold"} 1.0' in httpx.get(f"{quick}/gate/metrics").text


def test_a_group_holding_its_most_waiting_requests_refuses_the_next_at_once(
    setup: tuple[str, str, int, Path],
) -> None:
    _, quick, _, _ = setup
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(embed, quick, "cold-model")  # waits its 1.5 s for a replica that never comes
        deadline = time.monotonic() + 5
        while httpx.get(f"{quick}/gate/groups/cold").json()["waiting"] < 1:
            assert time.monotonic() < deadline, "the first request never waited"
            time.sleep(0.02)
        started = time.monotonic()
        second = embed(quick, "cold-model")
        refused_after = time.monotonic() - started
        assert first.result().status_code == 503
    assert (second.status_code, second.headers["Retry-After"]) == (503, str(RETRY_AFTER))
    assert "1 requests already wait for a replica of group 'cold'" in second.json()["error"]["message"]
    assert refused_after < 1.0  # refused at once, not after the wait


def test_what_the_gate_cannot_route_is_a_4xx(setup: tuple[str, str, int, Path]) -> None:
    gate, _, _, _ = setup
    unknown = embed(gate, "nope")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
    nameless = httpx.post(f"{gate}/v1/embeddings", json={"input": ["a"]})
    assert nameless.status_code == 400
    assert "X-Gateway-Model-Name" in nameless.json()["error"]["message"]
    large = httpx.post(f"{gate}/v1/embeddings", json={"model": "fake", "input": ["a" * 5000]})
    assert large.status_code == 413
    # within the body limit, past what the gate may hold of bodies at once: 503 at once, no wait
    started = time.monotonic()
    held = httpx.post(f"{gate}/v1/embeddings", json={"model": "cold-model", "input": ["a" * 3500]})
    assert (held.status_code, held.headers["Retry-After"]) == (503, str(RETRY_AFTER))
    assert "as many request bodies" in held.json()["error"]["message"]
    assert time.monotonic() - started < 5
    assert httpx.get(f"{gate}/gate/groups/embed").json()["in_flight"] == 0
