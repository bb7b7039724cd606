"""/v1/encode takes images by data URI: ColPali page multi-vectors from a JSON client, equal to an upload's."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.integration

PHOTO = "cats_coco_sample.jpg"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config
    from tests.builders.media import tiny_colpali
    from tests.conftest import start_server

    colpali = tiny_colpali(tmp_path_factory.mktemp("encode") / "colpali")
    settings = Settings(ServerSettings(), registry_config({"models": [{"name": "colpali", "source": str(colpali)}]}))
    live = start_server(create_app(settings))
    yield live
    live.close()


def test_page_multivectors_by_data_uri_equal_the_upload(server: LiveServer, data_dir: Path) -> None:
    photo = (data_dir / PHOTO).read_bytes()
    uri = "data:image/jpeg;base64," + base64.b64encode(photo).decode("ascii")
    body = {"model": "colpali", "input": [uri], "modality": "image", "outputs": ["multivector"]}
    with server.client() as client:
        encoded = client.post("/v1/encode", json=body)
        packed = client.post("/v1/encode", json={**body, "encoding_format": "base64"})
        uploaded = client.post(
            "/v1/embeddings/upload",
            data={"model": "colpali", "output": "multivector"},
            files=[("file", (PHOTO, photo, "image/jpeg"))],
        )
        not_media = client.post("/v1/encode", json={**body, "input": [[1, 2, 3]]})
    assert encoded.status_code == 200, encoded.text
    assert uploaded.status_code == 200, uploaded.text
    page = np.asarray(encoded.json()["data"][0]["multivector"], dtype=np.float32)
    expected = np.asarray(uploaded.json()["data"][0]["embedding"], dtype=np.float32)
    assert page.shape == tuple(uploaded.json()["data"][0]["shape"])
    np.testing.assert_allclose(page, expected, atol=1e-5)
    raw = packed.json()["data"][0]["multivector"]
    decoded = np.frombuffer(base64.b64decode(raw["data"]), dtype="<f4").reshape(raw["shape"])
    np.testing.assert_allclose(decoded, page, atol=1e-6)
    assert not_media.status_code == 422
