"""Microbenchmark of `Beams.step`: the numpy step against the compiled one (native/beam), side
by side in one run, in steady state at 5, 22 and 88 live beam-5 requests (requests finish and
new ones join to keep the count; both searches get the same decoder outputs, so they stay in
lockstep). Then the membership changes, `Beams.join` (4 requests joining 20 live) and
`Beams.keep` (4 of 24 leaving), per call, numpy against the kernel's join / keep: plain beam-5
requests, and requests keeping coverage and attention (the histories the widths follow).

    native/beam/build.sh .venv/bin/python
    .venv/bin/python bench/beam_kernel.py [--steps N] [--cycles N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from seqserve.service.scheduling import beam_native
from seqserve.service.scheduling.beam_search import Beams
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions

LIMITS = DecodeLimits(bos_id=2, eos_id=3, vocab_size=32000, max_decode_length=200)
OPTIONS = SearchOptions(beam_size=5, length_penalty=0.6)
SOURCE = 20


def _outputs(rng: np.random.Generator, rows: int, k: int) -> tuple[np.ndarray, ...]:
    """A decoder step's top-k (best first), EOS now and then, and attention rows."""
    logits = rng.normal(0.0, 2.0, size=(rows, k + 1))
    lp = np.sort(logits - np.log(np.exp(logits).sum(1, keepdims=True) + 50.0), axis=1)[:, ::-1]
    ids = rng.integers(4, LIMITS.vocab_size, size=(rows, k))
    eos = rng.random(rows) < 0.12
    ids[eos, int(rng.integers(0, 3))] = LIMITS.eos_id
    att = rng.random((rows, SOURCE)).astype(np.float32)
    att /= att.sum(1, keepdims=True)
    return np.ascontiguousarray(lp[:, :k], np.float32), ids, att


def run(live: int, steps: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    impls = {"numpy": Beams(LIMITS, kernel=False), "kernel": Beams(LIMITS, kernel=True)}
    times: dict[str, list[float]] = {name: [] for name in impls}
    key = 0
    for step in range(steps + 50):  # 50 warm-up steps
        n = live - len(impls["numpy"])
        if n > 0:
            srcs = [int(rng.integers(8, SOURCE + 1)) for _ in range(n)]
            for beams in impls.values():
                beams.join(list(range(key, key + n)), [OPTIONS] * n, srcs)
                beams.set_source_width(SOURCE)
            key += n
        ks = {beams.prepare() for beams in impls.values()}
        assert len(ks) == 1
        lp, ids, att = _outputs(rng, impls["numpy"].n_rows, ks.pop())
        parents = []
        for name, beams in impls.items():
            t0 = time.perf_counter()
            parents.append(beams.step(lp, ids, att))
            if step >= 50:
                times[name].append(time.perf_counter() - t0)
        assert np.array_equal(parents[0], parents[1])
        for beams in impls.values():
            if beams.done.any():
                beams.results(np.flatnonzero(beams.done))
                beams.keep(~beams.done)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


RICH = SearchOptions(beam_size=5, length_penalty=0.6, coverage_penalty=0.2,
                    return_attention=True)


def membership(options: SearchOptions, cycles: int, seed: int = 0) -> dict[str, float]:
    """Median us per `join` of 4 requests into 20 live ones and per `keep` of 20 of 24, in
    steady state: each cycle 4 join, the group steps twice (not timed), 4 leave (the done
    ones and then the earliest)."""
    rng = np.random.default_rng(seed)
    impls = {"numpy": Beams(LIMITS, kernel=False), "kernel": Beams(LIMITS, kernel=True)}
    times: dict[str, list[float]] = {f"{name} {op}": [] for name in impls
                                     for op in ("join", "keep")}
    for beams in impls.values():
        beams.join(list(range(20)), [options] * 20, [SOURCE] * 20)
        beams.set_source_width(SOURCE)
    key = 20
    for cycle in range(cycles + 20):  # 20 warm-up cycles
        srcs = [int(rng.integers(8, SOURCE + 1)) for _ in range(4)]
        for name, beams in impls.items():
            t0 = time.perf_counter()
            beams.join(list(range(key, key + 4)), [options] * 4, srcs)
            if cycle >= 20:
                times[f"{name} join"].append(time.perf_counter() - t0)
            beams.set_source_width(SOURCE)
        key += 4
        for _ in range(2):
            ks = {beams.prepare() for beams in impls.values()}
            lp, ids, att = _outputs(rng, impls["numpy"].n_rows, ks.pop())
            for beams in impls.values():
                beams.step(lp, ids, att)
            if impls["numpy"].done.any():
                break
        ref = impls["numpy"]
        leave = ref.done.copy()
        leave[np.flatnonzero(~leave)[: max(0, 4 - int(leave.sum()))]] = True
        for name, beams in impls.items():
            t0 = time.perf_counter()
            beams.keep(~leave)
            if cycle >= 20:
                times[f"{name} keep"].append(time.perf_counter() - t0)
        assert np.array_equal(impls["numpy"].rows.tokens, impls["kernel"].rows.tokens)
    return {name: 1e6 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--cycles", type=int, default=2000, help="join / keep cycles")
    args = parser.parse_args()
    if not beam_native.AVAILABLE:
        raise SystemExit("the beam kernel is not built: native/beam/build.sh PYTHON")
    print(f"Beams.step, median ms per step over {args.steps} steady-state steps (beam 5)")
    print(f"{'live requests':>14} {'numpy ms':>10} {'kernel ms':>10} {'speed-up':>9}")
    for live in (5, 22, 88):
        ms = run(live, args.steps)
        print(f"{live:>14} {ms['numpy']:>10.4f} {ms['kernel']:>10.4f} "
              f"{ms['numpy'] / ms['kernel']:>8.1f}x")
    print(f"\nBeams.join (4 joining 20 live) and Beams.keep (4 of 24 leaving), median us per "
          f"call over {args.cycles} cycles (beam 5)")
    print(f"{'requests':>22} {'numpy us':>10} {'kernel us':>10} {'speed-up':>9}")
    for label, options in (("plain", OPTIONS), ("coverage + attention", RICH)):
        us = membership(options, args.cycles)
        for op in ("join", "keep"):
            a, b = us[f"numpy {op}"], us[f"kernel {op}"]
            print(f"{label + ' ' + op:>22} {a:>10.1f} {b:>10.1f} {a / b:>8.1f}x")


if __name__ == "__main__":
    main()
