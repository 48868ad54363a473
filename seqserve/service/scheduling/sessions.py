"""Stateful sessions of a feature-sequence model whose graph exports its state.

A session is a series sent in chunks: each chunk runs from the state the previous chunk left
(zeros on `start`) and leaves its own `new_state` for the next one, so the chunks' outputs
are the whole series' outputs. `SessionStore` holds one model version's sessions (the engine
keys stores by (model, version), so a session is (model, version, session id)):

- `acquire(id, start, end)` before a chunk runs: `start` creates the session (or restarts a
  live one from zeros); without it the session must be live, else `SessionNotFound` (never
  started, ended, expired, or lost with a restart: the client restarts it with its
  history). A session whose chunk is in flight answers `SessionBusy` (one chunk per session
  at a time); a new session beyond `max_sessions` gets `TooManySessions` (429 +
  Retry-After): a live session is never evicted to make room. A one-shot chunk (`start`
  and `end` together, of a session not live) outlives nothing: it runs in a session of its
  own that never enters the table, so it takes no slot and is never refused for want of
  one.
- `release(session, new_state, steps, end)` when the chunk's row is done: a computed chunk
  stores its state and adds its steps (`end` deletes the session); a failed or cancelled one
  leaves the state as it was, so the client may send the chunk again.
- `sweep()` expires sessions idle (no chunk in flight) for `idle_timeout_s`; the model runs
  it periodically and `acquire` checks the one it finds, so expiry is exact to the second
  whatever the sweep's period.

Metrics: the observer's `on_sessions` (live sessions), and, where it has them (core.metrics'
`ModelMetrics` does; the scheduling `Observer` protocol does not require them),
`on_session_capacity` (max_sessions, once) and `on_session_refused(reason)` for each chunk
refused: "full", "quota", "busy" or "unknown". A new session beyond `max_per_owner` of its
owner (`--max-sessions-per-key`: an API key, or a client address when keys are off) gets
`TooManySessions` too: one client cannot take every slot of a shared table.

Memory: one float32 row of `state_dim` per session, at most max_sessions x state_dim x 4
bytes per model version. Everything runs on the event loop's thread (no locks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from seqserve.service.core.errors import SessionBusy, SessionNotFound, TooManySessions
from seqserve.service.scheduling.base import NullObserver, Observer

MAX_SESSION_ID = 128
"""Longest session id, in characters."""


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """Bounds of one model's sessions (`EngineOptions.model_config` derives them)."""

    max_sessions: int
    """Most live sessions per model version."""
    idle_timeout_s: float
    """A session with no chunk for this long expires."""
    retry_after_s: float
    """Retry-After of the 429 for a session beyond `max_sessions`."""
    max_per_owner: int = 0
    """Most live sessions one owner (an API key, or a client address when keys are off) may
    hold in this model version; 0: no quota but `max_sessions`."""


@dataclass(eq=False)
class Session:
    """One live session: its state after the steps seen so far."""

    id: str
    state: np.ndarray
    """float32 (state_dim,): the state after the last computed chunk (zeros at start)."""
    started: float
    used: float
    """time.monotonic() of its last chunk's start or end."""
    steps: int = 0
    """Steps computed so far in this session."""
    busy: bool = field(default=False)
    """A chunk of it is in flight."""
    owner: str = ""
    """Who started it (`SessionConfig.max_per_owner`)."""


class SessionStore:
    """One model version's sessions (see the module doc)."""

    def __init__(self, state_dim: int, config: SessionConfig, observer: Observer | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state_dim = state_dim
        self.config = config
        self.observer: Observer = observer or NullObserver()
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.owned: dict[str, int] = {}
        """Live sessions per owner (with a quota)."""
        self._refused = getattr(self.observer, "on_session_refused", None)
        capacity = getattr(self.observer, "on_session_capacity", None)
        if capacity is not None:
            capacity(config.max_sessions)

    def _refuse(self, reason: str, exc: Exception) -> Exception:
        if self._refused is not None:
            self._refused(reason)
        return exc

    def __len__(self) -> int:
        return len(self.sessions)

    def state_bytes(self) -> int:
        """The most state memory this store can hold (max_sessions x state_dim x 4)."""
        return self.config.max_sessions * self.state_dim * 4

    def _zeros(self) -> np.ndarray:
        return np.zeros(self.state_dim, np.float32)

    def _expired(self, s: Session, now: float) -> bool:
        return not s.busy and now - s.used > self.config.idle_timeout_s

    def _close(self, s: Session, now: float, expired: bool) -> None:
        if self.sessions.get(s.id) is s:
            del self.sessions[s.id]
            self._disown(s)
        self.observer.on_session_closed(now - s.started, expired)
        self.observer.on_sessions(len(self.sessions))

    def _disown(self, s: Session) -> None:
        left = self.owned.get(s.owner, 0) - 1
        if left > 0:
            self.owned[s.owner] = left
        else:
            self.owned.pop(s.owner, None)

    def acquire(self, session_id: str, start: bool, end: bool = False,
                owner: str = "") -> Session:
        """The session a chunk runs in, marked busy (module doc for the errors); `owner`: who
        sends it (an API key's digest, or a client address), for the per-owner quota."""
        now = self.clock()
        s = self.sessions.get(session_id)
        if s is not None and self._expired(s, now):
            self._close(s, now, expired=True)
            s = None
        if s is None and start and end:  # one-shot: no slot (module doc)
            return Session(session_id, self._zeros(), started=now, used=now, busy=True)
        if s is not None and s.busy:
            raise self._refuse("busy", SessionBusy(
                f"session {session_id!r} has a chunk in flight: send its next chunk after "
                "that one's answer (one chunk per session at a time)"))
        if s is None and not start:
            raise self._refuse("unknown", SessionNotFound(
                f"session {session_id!r} is unknown: it was never started, it ended, it "
                f"expired after {self.config.idle_timeout_s:g} s idle, or the server restarted "
                "(sessions live in memory). Start it again with \"start\": true (OIP: "
                "sequence_start) and its history"))
        if s is None:
            if len(self.sessions) >= self.config.max_sessions:
                self.sweep()
            if len(self.sessions) >= self.config.max_sessions:
                raise self._refuse("full", TooManySessions(
                    f"this model holds its limit of {self.config.max_sessions} live sessions "
                    "(max_sessions); retry later, or end sessions you no longer need "
                    "(\"end\": true)", retry_after=self.config.retry_after_s))
            quota = self.config.max_per_owner
            if quota and self.owned.get(owner, 0) >= quota:
                self.sweep()  # its idle ones past the timeout are not its any more
            if quota and self.owned.get(owner, 0) >= quota:
                raise self._refuse("quota", TooManySessions(
                    f"you hold {quota} live sessions of this model, your quota "
                    "(max_sessions_per_key: per API key, or per client address without "
                    "keys); end one (\"end\": true) or wait for one to expire after "
                    f"{self.config.idle_timeout_s:g} s idle",
                    retry_after=self.config.retry_after_s))
            s = Session(session_id, self._zeros(), started=now, used=now, owner=owner)
            self.sessions[session_id] = s
            self.owned[owner] = self.owned.get(owner, 0) + 1
            self.observer.on_sessions(len(self.sessions))
        elif start:  # a restart: the old session ends here, a new one begins from zeros
            self.observer.on_session_closed(now - s.started, False)
            s.state, s.steps, s.started = self._zeros(), 0, now
        s.busy, s.used = True, now
        return s

    def release(self, s: Session, new_state: np.ndarray | None, steps: int, end: bool) -> None:
        """A chunk of `s` is done: computed (`new_state` given) or not (None)."""
        now = self.clock()
        s.busy, s.used = False, now
        if new_state is None:
            return
        s.state = np.asarray(new_state, np.float32).reshape(self.state_dim).copy()
        s.steps += steps
        if end:
            self._close(s, now, expired=False)

    def sweep(self) -> int:
        """Expire every idle session past its timeout; how many."""
        now = self.clock()
        gone = [s for s in self.sessions.values() if self._expired(s, now)]
        for s in gone:
            self._close(s, now, expired=True)
        return len(gone)
