from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_fake_model_embeds_over_http(serve: Any) -> None:
    server = serve({"models": [{"name": "fake", "source": "fake", "kind": "fake", "pin": True}]})
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": "fake", "input": ["a b", "c"]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
