"""A standard OIP client (tritonclient's HTTP client) against the server, unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from service_fakes import serve_in_thread

from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

httpclient = pytest.importorskip("tritonclient.http")
MODEL = "tiny-clf"


@pytest.fixture(scope="module")
def url(tiny_repo: Path) -> Iterator[str]:
    with serve_in_thread(create_app(Settings(repo=tiny_repo, warmup=False))) as base:
        yield base.removeprefix("http://")


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infer(url: str, binary: bool, tiny_repo: Path) -> None:
    manifest = json.loads((tiny_repo / MODEL / "1" / "manifest.json").read_text())
    names = manifest["labels"]
    client = httpclient.InferenceServerClient(url=url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("nope")
    meta = client.get_model_metadata(MODEL)
    assert meta["inputs"][0]["datatype"] == "BYTES"
    texts = np.array(["one two three", "vingt et un", "cent"], dtype=object)
    inp = httpclient.InferInput("text", [3], "BYTES")
    inp.set_data_from_numpy(texts, binary_data=binary)
    outputs = None
    if not binary:
        outputs = [httpclient.InferRequestedOutput("label", binary_data=False),
                   httpclient.InferRequestedOutput("probabilities", binary_data=False)]
    result = client.infer(MODEL, [inp], outputs=outputs, request_id="abc")
    probs = result.as_numpy("probabilities")
    labels = result.as_numpy("label")
    assert probs.shape == (3, len(names)) and probs.dtype == np.float32
    assert np.allclose(probs.sum(1), 1, atol=1e-5)
    decoded = [x.decode() if isinstance(x, bytes) else x for x in labels]
    assert decoded == [names[i] for i in probs.argmax(1)]
    assert result.get_response()["id"] == "abc"


def test_tritonclient_error_is_reported(url: str) -> None:
    client = httpclient.InferenceServerClient(url=url)
    inp = httpclient.InferInput("wrong", [1], "BYTES")
    inp.set_data_from_numpy(np.array(["a"], dtype=object))
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="text"):
        client.infer(MODEL, [inp])


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_tritonclient_compressed_request(url: str, compression: str) -> None:
    """tritonclient's request compression (Content-Encoding gzip, or deflate as zlib's
    format) over its binary tensor extension: the same answer as uncompressed."""
    client = httpclient.InferenceServerClient(url=url)
    inp = httpclient.InferInput("text", [2], "BYTES")
    inp.set_data_from_numpy(np.array(["one two three", "cent"], dtype=object), binary_data=True)
    plain = client.infer(MODEL, [inp]).as_numpy("probabilities")
    packed = client.infer(MODEL, [inp], request_compression_algorithm=compression)
    assert np.array_equal(packed.as_numpy("probabilities"), plain)


def test_triton_shapes_priority_and_the_kserve_sdk_body(url: str) -> None:
    """As Triton's examples and the KServe SDK send requests: BYTES shaped [n, 1], the
    `priority` parameter, and `model_name` / `model_version` in the body (each was a 400)."""
    import httpx

    client = httpclient.InferenceServerClient(url=url)
    texts = np.array([["one two three"], ["cent"]], dtype=object)
    inp = httpclient.InferInput("text", [2, 1], "BYTES")
    inp.set_data_from_numpy(texts)
    flat = httpclient.InferInput("text", [2], "BYTES")
    flat.set_data_from_numpy(texts.reshape(-1))
    shaped = client.infer(MODEL, [inp], priority=3).as_numpy("probabilities")
    assert np.allclose(shaped, client.infer(MODEL, [flat]).as_numpy("probabilities"))
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                        "data": ["cent"]}]}
    base = f"http://{url}/v2/models/{MODEL}"
    for extra, path, status in (({"model_name": MODEL}, "/infer", 200),
                                ({"model_name": MODEL, "model_version": "1"},
                                 "/versions/1/infer", 200),
                                ({"model_name": "other"}, "/infer", 400),
                                ({"model_name": MODEL, "model_version": "2"},
                                 "/versions/1/infer", 400)):
        r = httpx.post(base + path, json={**body, **extra})
        assert r.status_code == status, (extra, r.text)
        if status == 400:
            assert "does not match the path" in r.json()["error"]
    meta = httpx.get(f"http://{url}/v2").json()
    assert {"sequence", "binary_tensor_data"} <= set(meta["extensions"])


def test_a_language_model_metadata_is_what_infer_takes(tiny_lm_repo: Path) -> None:
    """text-lm's metadata listed a translator's outputs while infer answered 400; now it
    lists `text_input` -> `text_output`, and infer generates as the generate extension does."""
    import httpx

    name = next(p.name for p in tiny_lm_repo.iterdir() if p.is_dir())
    with serve_in_thread(create_app(Settings(repo=tiny_lm_repo, warmup=False))) as base:
        client = httpclient.InferenceServerClient(url=base.removeprefix("http://"))
        meta = client.get_model_metadata(name)
        assert [t["name"] for t in meta["inputs"]] == ["text_input"]
        assert [t["name"] for t in meta["outputs"]] == ["text_output"]
        inp = httpclient.InferInput("text_input", [2, 1], "BYTES")
        inp.set_data_from_numpy(np.array([["the"], ["a"]], dtype=object))
        params = {"max_tokens": 5, "temperature": 0}
        out = client.infer(name, [inp], parameters=params).as_numpy("text_output")
        got = [x.decode() if isinstance(x, bytes) else x for x in out.reshape(-1)]
        for prompt, text in zip(("the", "a"), got, strict=True):
            want = httpx.post(f"{base}/v2/models/{name}/generate",
                              json={"text_input": prompt, "parameters": params}).json()
            assert text == want["text_output"]
