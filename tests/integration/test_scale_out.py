"""The scale-out simulation in its short form: the chart's layout as processes behind Caddy.

Two groups as the chart renders them (two replicas of the first), Caddy routing on the
X-Gateway-Model-Name header, one replica killed mid-traffic: every request reaches its group, the
replicas' own metrics agree with what the clients saw, and retrying clients lose nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_requests_reach_their_group_and_none_is_lost_when_a_replica_dies(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    command = [sys.executable, str(REPO / "benchmarks" / "scale_out.py"), "--quick", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    routing, failover = figures["routing"], figures["failover"]
    assert routing["requests"] == routing["ok"] == 24
    assert routing["wrong_group"] == 0
    assert routing["counts_agree"]
    assert len(routing["per_replica_counted_by_servers"]) == 3
    assert failover["requests"] == failover["ok"] == 24
    assert failover["lost"] == 0
    assert failover["killed_after_requests"] is not None
