"""A served request leaves no reference cycle behind: what it made is freed when its answer
is written (reference counting), not by the garbage collector. Under 64 connections of
translations each request left ~30 objects in cycles (its scope, state, `Call`,
`RequestContext`, trace, disconnect future): every young collection then walked ~47,000 of
them, 26-62 ms with the event loop stopped, the p99 (docs/performance.md section 39)."""

from __future__ import annotations

import collections
import gc
import http.client
import json
import shutil
from pathlib import Path
from typing import Any

from service_fakes import serve_in_thread, settings

from seqserve.service.server.app import create_app

OIP_TEXT = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["one two"]}]}
ROUTES: list[tuple[str, Any, int]] = [
    ("/v1/models/tiny-clf/classify", {"texts": ["one two three"]}, 200),
    ("/v1/models/tiny-mt/translate", {"texts": ["one two"]}, 200),
    ("/v1/models/tiny-tag/tag", {"texts": ["one two three"]}, 200),
    ("/v1/models/tiny-clf:predict", {"instances": ["one two"]}, 200),
    ("/v2/models/tiny-clf/infer", OIP_TEXT, 200),
    ("/v2/models/tiny-mt/infer", OIP_TEXT, 200),
    ("/v1/models/tiny-lm/generate", {"prompts": ["one"], "max_new_tokens": 3}, 200),
    ("/v1/models/tiny-lm/score", {"texts": ["one two"]}, 200),
    ("/v1/completions", {"model": "tiny-lm", "prompt": "one", "max_tokens": 3}, 200),
    ("/v1/completions", {"model": "tiny-lm", "prompt": "one", "max_tokens": 3,
                         "stream": True}, 200),
    ("/v2/models/tiny-lm/generate_stream", {"text_input": "one",
                                            "parameters": {"max_tokens": 3}}, 200),
    ("/v1/models/tiny-clf/classify", b"{not json", 422),
    ("/v1/models/tiny-clf/classify", {"texts": []}, 422),
    ("/v1/models/nope/classify", {"texts": ["one"]}, 404),
]


def _send(conn: http.client.HTTPConnection, path: str, body: Any) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"content-type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def _ours(obj: Any) -> bool:
    """Whether a collected object is the server's: a seqserve or asyncio object, or an ASGI
    scope (the test's own client, http.client, makes no cycles; another thread's garbage in
    the same window would be neither)."""
    module = getattr(type(obj), "__module__", "") or ""
    if module.startswith(("seqserve", "asyncio", "_asyncio", "starlette", "fastapi")):
        return True
    return type(obj) is dict and obj.get("type") == "http" and "headers" in obj


def test_a_served_request_leaves_no_reference_cycle(tiny_full_repo: Path, tiny_lm_repo: Path,
                                                    tmp_path: Path, http_front: str) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_full_repo, repo)
    shutil.copytree(tiny_lm_repo / "tiny-lm", repo / "tiny-lm")
    app = create_app(settings(repo, front=http_front))
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        for path, body, status in ROUTES:  # first uses (imports, caches) outside the window
            for _ in range(3):
                assert _send(conn, path, body) == status, path
        gc.collect()
        gc.disable()
        try:
            for path, body, status in ROUTES:
                for _ in range(10):
                    assert _send(conn, path, body) == status, path
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [o for o in gc.garbage if _ours(o)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        conn.close()
    kinds = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in left)
    assert not kinds, kinds.most_common(10)
