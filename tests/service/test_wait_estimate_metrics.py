"""The wait estimate's error in /metrics (issue 37): a real server (the default layout) after a
burst of concurrent requests reports, per model, one observation of actual minus expected
queue wait per served row (batcher) or source (translator), every one within seconds of 0
(a mix of clocks, or a wait taken from the wrong row, lands far outside)."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import httpx
from process_support import serve
from prometheus_client.parser import text_string_to_metric_families

NAME = "seqserve_queue_wait_estimate_error_seconds"
MODEL_NAME = "seqserve_queue_wait_model_error_seconds"


def _histogram(metrics: str, name: str = NAME) -> dict[str, dict[str, float]]:
    """model -> {"count", "sum", "le=BOUND": cumulative count} of the error histogram."""
    out: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float))
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            model = s.labels.get("model", "")
            if s.name == f"{name}_count":
                out[model]["count"] += s.value
            elif s.name == f"{name}_sum":
                out[model]["sum"] += s.value
            elif s.name == f"{name}_bucket":
                out[model][f"le={float(s.labels['le']):g}"] += s.value
    return out


async def _burst(url: str, n: int) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:
        async def one(i: int) -> int:
            if i % 2:
                r = await client.post(f"{url}/v1/models/tiny-mt/translate",
                                      json={"texts": [f"text {i}"]})
            else:
                r = await client.post(f"{url}/v1/models/tiny-clf/classify",
                                      json={"texts": [f"text {i}", f"more text {i}"]})
            return r.status_code
        return await asyncio.gather(*(one(i) for i in range(n)))


def test_a_burst_leaves_wait_estimate_errors_per_model_in_metrics(tiny_repo: Path) -> None:
    with serve(tiny_repo) as server:
        before = _histogram(httpx.get(f"{server.url}/metrics", timeout=30).text)
        assert not any(h["count"] for h in before.values()), before
        statuses = asyncio.run(_burst(server.url, 64))
        statuses += asyncio.run(_burst(server.url, 64))
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        after, model_after = _histogram(text), _histogram(text, MODEL_NAME)
    ok = collections.Counter(("tiny-mt", "tiny-clf")[i % 2 == 0] for i, s in
                             enumerate(statuses) if s == 200)
    assert set(statuses) <= {200, 429}, statuses
    rows = {"tiny-clf": 2 * ok["tiny-clf"], "tiny-mt": ok["tiny-mt"]}
    for model, served in rows.items():
        seen = after[model]
        # one observation per admitted row or source (an unmeasured estimate counts as 0)
        assert seen["count"] == served > 0, (model, served, dict(seen))
        assert seen["le=2"] - seen["le=-2"] == seen["count"], dict(seen)  # all within 2 s
        assert abs(seen["sum"]) < 2 * seen["count"], dict(seen)
        # the cost model's own error (before the margin): as many observations, as close
        own = model_after[model]
        assert own["count"] == served and own["le=2"] - own["le=-2"] == served, dict(own)
        assert own["sum"] >= seen["sum"] - 1e-9  # the margin (>= 1) only lengthens estimates
