"""The one input contract (`encode_texts`) and the one wait (`RequestContext.wait`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from seqserve.models.text.tokenizer import Tokenizer
from seqserve.service.core.errors import BadRequest, ClientGone, DeadlineExceeded
from seqserve.service.scheduling.base import Timed, Timing
from seqserve.service.workers.base import RequestContext, TextLimits, encode_texts

LIMITS = TextLimits(max_texts=3, max_chars=40, max_tokens=5, truncate=False)


@pytest.fixture(scope="module")
def tok(tiny_repo: Path) -> Tokenizer:
    return Tokenizer.load(tiny_repo / "tiny-clf" / "1" / "tokenizer.model")


@pytest.mark.parametrize(("texts", "message"), [
    ([], "no texts"),
    (["one"] * 4, "max_texts 3"),
    (["one", "x" * 41], r"texts\[1\] has 41 characters"),
    (["two \ud800"], r"texts\[0\] is not valid Unicode"),
    (["a\x00b"], "NUL"),
    (["   "], "empty"),
    (["one two three four five six"], "max_tokens 5"),
    ([7], "must be a string"),
])
def test_refusals_name_the_text_and_the_limit(tok: Tokenizer, texts: list[str],
                                              message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        encode_texts(tok, texts, LIMITS)


def test_ids_offsets_and_truncation(tok: Tokenizer) -> None:
    text = "one two three four five six"
    cut = encode_texts(tok, [text], TextLimits(3, 40, 5, truncate=True), offsets=True)[0]
    full = tok.encode_with_offsets(text)
    assert cut.truncated and cut.ids == [p.id for p in full][:5]
    assert cut.pieces is not None and [p.start for p in cut.pieces] == [p.start for p in full][:5]
    plain = encode_texts(tok, ["one two"], TextLimits(3, 40, 64, truncate=False))[0]
    assert plain.pieces is None and not plain.truncated and plain.ids == tok.encode("one two")


def _timed(value: int, queue_s: float = 0.01) -> Timed[int]:
    return Timed(value, Timing(queue_s, 0.02, 1, 0))


def test_wait_records_timing_and_cancels_the_rest_on_deadline() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Timed[int]] = loop.create_future()
        done.set_result(_timed(1, 0.03))
        call = RequestContext(deadline=time.monotonic() + 5)
        assert [t.value for t in await call.wait([done])] == [1]
        assert call.computed and call.queue_s == 0.03 and call.compute_s == 0.02
        never: asyncio.Future[Timed[int]] = loop.create_future()
        with pytest.raises(DeadlineExceeded):
            await RequestContext(deadline=time.monotonic() + 0.02).wait([never])
        assert never.cancelled()  # the scheduler drops it before it costs compute

    asyncio.run(scenario())


def test_wait_gives_up_when_the_client_leaves() -> None:
    async def scenario() -> None:
        pending: asyncio.Future[Timed[int]] = asyncio.get_running_loop().create_future()
        call = RequestContext(deadline=time.monotonic() + 30)
        waiting = asyncio.ensure_future(call.wait([pending]))
        await asyncio.sleep(0.01)
        call.disconnected.set()
        with pytest.raises(ClientGone):
            await waiting
        assert pending.cancelled()

    asyncio.run(scenario())
