"""`SessionStore` alone (fake clock): start, continue, busy, end, restart, bounds, expiry, and
what a failed chunk leaves."""

from __future__ import annotations

import numpy as np
import pytest

from seqserve.service.core.errors import SessionBusy, SessionNotFound, TooManySessions
from seqserve.service.scheduling.sessions import SessionConfig, SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Seen:
    def __init__(self) -> None:
        self.live: list[int] = []
        self.closed: list[tuple[float, bool]] = []

    def on_sessions(self, live: int) -> None:
        self.live.append(live)

    def on_session_closed(self, lifetime_s: float, expired: bool) -> None:
        self.closed.append((lifetime_s, expired))


def _store(max_sessions: int = 2, idle: float = 10.0) -> tuple[SessionStore, Clock, Seen]:
    clock, seen = Clock(), Seen()
    cfg = SessionConfig(max_sessions=max_sessions, idle_timeout_s=idle, retry_after_s=2.0)
    return SessionStore(3, cfg, seen, clock), clock, seen  # type: ignore[arg-type]


def test_a_session_carries_its_state_and_steps_until_it_ends() -> None:
    store, clock, seen = _store()
    s = store.acquire("a", start=True)
    assert s.busy and (s.state == 0).all() and store.state_bytes() == 2 * 3 * 4
    with pytest.raises(SessionBusy, match="in flight"):
        store.acquire("a", start=False)
    with pytest.raises(SessionBusy):
        store.acquire("a", start=True)  # a restart waits for the chunk in flight too
    store.release(s, np.array([1.0, 2.0, 3.0]), 4, end=False)
    s = store.acquire("a", start=False)
    assert s.state.tolist() == [1.0, 2.0, 3.0] and s.steps == 4
    clock.now += 5
    store.release(s, np.array([4.0, 5.0, 6.0]), 2, end=True)
    assert len(store) == 0 and seen.closed == [(5.0, False)] and seen.live == [1, 0]
    with pytest.raises(SessionNotFound, match="unknown"):
        store.acquire("a", start=False)


def test_a_failed_chunk_leaves_the_state_and_start_restarts() -> None:
    store, _, _ = _store()
    s = store.acquire("a", start=True)
    store.release(s, np.ones(3), 3, end=False)
    s = store.acquire("a", start=False)
    store.release(s, None, 0, end=True)  # failed: not ended, state as it was
    s = store.acquire("a", start=False)
    assert s.steps == 3 and (s.state == 1).all()
    store.release(s, np.ones(3), 1, end=False)
    s = store.acquire("a", start=True)
    assert s.steps == 0 and (s.state == 0).all()


def test_beyond_max_sessions_is_refused_and_idle_ones_expire() -> None:
    store, clock, seen = _store(max_sessions=2, idle=10.0)
    for sid in ("a", "b"):
        store.release(store.acquire(sid, start=True), np.ones(3), 1, end=False)
    with pytest.raises(TooManySessions) as refused:
        store.acquire("c", start=True)
    assert refused.value.retry_after == 2.0 and len(store) == 2
    busy = store.acquire("a", start=False)  # in flight: never expires
    clock.now += 11
    assert store.sweep() == 1 and seen.closed == [(11.0, True)]
    with pytest.raises(SessionNotFound, match="expired after 10 s"):
        store.acquire("b", start=False)
    store.release(busy, np.ones(3), 1, end=False)
    store.acquire("c", start=True)  # b's slot
    clock.now += 10.5
    with pytest.raises(SessionNotFound):
        store.acquire("a", start=False)  # found expired before any sweep


def test_a_one_shot_chunk_takes_no_slot() -> None:
    """`start` and `end` together outlive nothing: before, such a request was refused when
    the table was full (10,000 ids filled it in ~1.5 s and blocked every session for the idle
    timeout); now it runs from zeros in a session of its own and leaves nothing behind."""
    store, _, seen = _store(max_sessions=1)
    held = store.acquire("long-lived", start=True)
    store.release(held, np.ones(3), 2, end=False)
    with pytest.raises(TooManySessions):
        store.acquire("other", start=True)
    for i in range(3):
        s = store.acquire(f"once-{i}", start=True, end=True)
        assert s.busy and (s.state == 0).all() and len(store) == 1
        store.release(s, np.full(3, 5.0), 4, end=True)
        assert set(store.sessions) == {"long-lived"}
    again = store.acquire("long-lived", start=False)  # untouched by the one-shots
    assert again.state.tolist() == [1.0, 1.0, 1.0] and again.steps == 2
    store.release(again, None, 0, end=False)
    live = store.acquire("long-lived", start=True, end=True)  # a live one: restarted, ended
    assert live is store.sessions["long-lived"] and (live.state == 0).all()
    store.release(live, np.zeros(3), 1, end=True)
    assert len(store) == 0 and seen.live[-1] == 0


def test_an_owner_holds_at_most_its_quota_and_expiry_frees_it() -> None:
    clock = Clock()
    cfg = SessionConfig(max_sessions=8, idle_timeout_s=10.0, retry_after_s=2.0,
                        max_per_owner=2)
    store = SessionStore(4, cfg, clock=clock)
    for sid in ("a", "b"):
        store.release(store.acquire(sid, True, owner="alice"), np.ones(4), 1, False)
    with pytest.raises(TooManySessions, match="max_sessions_per_key"):
        store.acquire("c", True, owner="alice")
    store.release(store.acquire("d", True, owner="bob"), np.ones(4), 1, False)
    clock.now += 11.0  # alice's sessions expire: her slots come back
    store.release(store.acquire("c", True, owner="alice"), np.ones(4), 1, False)
    assert store.owned == {"alice": 1}
