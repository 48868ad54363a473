"""Fakes for service tests: a deterministic runtime, a batcher factory, a threaded server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI

from seqserve.service.runtimes.base import RuntimeSpec
from seqserve.service.scheduling.batcher import Batcher, BatcherConfig
from seqserve.service.scheduling.decoding import DecodeConfig
from seqserve.service.web.settings import Settings


class FakeRuntime:
    """A classifier 'graph' whose row results depend on that row alone.

    logits[b, c] = mean over valid t of cos(ids[b, t] * (c + 1)); attention uniform over the
    valid positions, 0 on padding. `delay_s` sleeps per batch; `fail_next` raises once per
    unit; `calls` records each batch's shape.
    """

    name = "fake"

    def __init__(self, classes: int = 3, delay_s: float = 0.0) -> None:
        self.providers = ["fake"]
        self.classes = classes
        self.delay_s = delay_s
        self.fail_next = 0
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, lengths = inputs["input_ids"], inputs["lengths"]  # (B, T), (B,)
        with self.lock:
            self.calls.append(ids.shape)
            fail = self.fail_next > 0
            if fail:
                self.fail_next -= 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if fail:
            raise RuntimeError("injected runtime fault")
        b, t = ids.shape
        mask = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
        k = np.arange(1, self.classes + 1, dtype=np.float64)  # (C,)
        vals = np.cos(ids[:, :, None] * k[None, None, :]) * mask[:, :, None]  # (B, T, C)
        logits = (vals.sum(1) / lengths[:, None]).astype(np.float32)  # (B, C)
        attention = (mask / lengths[:, None]).astype(np.float32)  # (B, T)
        return {"logits": logits, "attention": attention}


def fake_factory(runtime: FakeRuntime) -> Callable[..., FakeRuntime]:
    """A runtime_factory for create_app that hands out `runtime` for every bundle."""
    return lambda settings, path, manifest: runtime


# The engine-side configs have no defaults (the server's come from Settings); tests that build
# them directly start from these explicit values and override what they test.
TEST_BATCHER: dict[str, Any] = {
    "max_batch_size": 32, "max_batch_tokens": 4096, "max_wait_s": 0.01, "queue_size": 256,
    "retry_after_s": 1.0, "max_queue_wait_s": None, "overhead_tokens": 64.0}
TEST_DECODE: dict[str, Any] = {
    "max_live_hypotheses": 256, "max_queue": 512, "max_admit": 64, "groups": 1,
    "retry_after_s": 1.0, "max_queue_wait_s": None}
TEST_RUNTIME: dict[str, Any] = {
    "kind": "onnx", "device": "cpu", "providers": (), "intra_op_threads": 0,
    "inter_op_threads": 0}


def batcher_config(**overrides: Any) -> BatcherConfig:
    return BatcherConfig(**{**TEST_BATCHER, **overrides})


def decode_config(**overrides: Any) -> DecodeConfig:
    return DecodeConfig(**{**TEST_DECODE, **overrides})


def runtime_spec(**overrides: Any) -> RuntimeSpec:
    return RuntimeSpec(**{**TEST_RUNTIME, **overrides})


def make_batcher(
    compute: Callable[[list[Any]], list[Any]] | None = None, **overrides: Any
) -> Batcher[Any, Any]:
    """A Batcher over `compute` (default: echo the payloads) with BatcherConfig overrides."""
    return Batcher(compute or (lambda rows: list(rows)), batcher_config(**overrides),
                   name="test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_in_thread(app: Any, timeout: float = 60.0,
                    **config: Any) -> contextlib.AbstractContextManager[str]:
    """Run `app` under a real uvicorn on 127.0.0.1 in a thread; yields the base URL.
    `config`: more uvicorn options (`http=guarded_protocol(...)`: the server's protocol)."""
    from server_support import serve_app  # here: server subprocesses import this module bare

    return serve_app(app, timeout_s=timeout, **config)


def serve_repo(repo: Path, **overrides: Any) -> contextlib.AbstractContextManager[str]:
    """seqserve's own app over the bundles of `repo` (one runtime thread; `overrides`: more
    settings) under a real uvicorn in a thread; yields the base URL. Its requests may wait
    SERVE_REPO_WAIT_S (unless overridden): the server shares its process with the test's
    client, and on a busy CI machine a request read while the host stalled for 1.5 s was
    refused as waiting past the default 0.5 s (a 429 none of these tests is about)."""
    from seqserve.service.server.app import create_app

    settings = {"max_queue_wait_s": SERVE_REPO_WAIT_S, **overrides}
    return serve_in_thread(create_app(Settings(repo=repo, intra_op_threads=1, **settings)))


SERVE_REPO_WAIT_S = 30.0


def copy_repo(src: Path, dst: Path) -> Path:
    """A private copy of a model repository (tests that tamper must not touch the shared one)."""
    import shutil

    shutil.copytree(src, dst)
    return dst


def settings(repo: Path, **overrides: Any) -> Settings:
    """Test settings: one runtime thread, no warm-up, requests may wait SERVE_REPO_WAIT_S
    (unless overridden; as `serve_repo`: CI refused a classify read while the test's own
    model load stalled the shared process for 1.1 s, a 429 the test was not about)."""
    return Settings(**{"repo": repo, "intra_op_threads": 1, "inter_op_threads": 1,
                       "warmup": False, "max_queue_wait_s": SERVE_REPO_WAIT_S, **overrides})


@contextlib.asynccontextmanager
async def serve_asgi(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan, behind an in-process httpx client (no socket)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                     timeout=60) as client:
            yield client


def run_bounded(coro):  # type: ignore[no-untyped-def]
    """asyncio.run with a 90 s bound, so a hung scenario fails instead of hanging CI."""
    return asyncio.run(asyncio.wait_for(coro, timeout=90))


def served(app: FastAPI, name: str) -> Any:
    """The scheduled model (`scheduling.models`) of model `name`'s default version in an
    app whose models run in its own process (its `LocalEngine`)."""
    entry = app.state.seqserve.repository.entry(name)
    return entry.model.engine.served[name, entry.version]


class CountingEntry:
    """The app's lifecycle (`app.entry`), counting the requests that run the app (the full
    path: `calls`); its `answer_head` (counted: `heads`) and `front_rule` are the lifecycle's.
    With `now`, also its `answer_now` (the native front then answers plain routes without a
    task: `now` counts them); without, the native front runs the app for every request."""

    def __init__(self, inner: Any, now: bool = False) -> None:
        self.inner = inner
        self.calls = 0
        self.heads = 0
        """Heads the front asked Python about (`answer_head`)."""
        self.now = 0
        if now:
            self.answer_now = self._answer_now

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.calls += 1
        await self.inner(scope, receive, send)

    def answer_head(self, scope: Any) -> Any:
        self.heads += 1
        return self.inner.answer_head(scope)

    def front_rule(self) -> Any:
        """The lifecycle's: the native front refuses from heads itself by it."""
        return self.inner.front_rule()

    def _answer_now(self, scope: Any, body: bytes, write: Any) -> bool:
        taken = bool(self.inner.answer_now(scope, body, write))
        self.now += taken
        return taken
