"""Microbenchmark of `Beams.step`: the numpy step against the compiled one (native/beam), side
by side in one run, in steady state at 5, 22 and 88 live beam-5 requests (requests finish and
new ones join to keep the count; both searches get the same decoder outputs, so they stay in
lockstep).

    native/beam/build.sh .venv/bin/python && .venv/bin/python bench/beam_kernel.py [--steps N]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    if not beam_native.AVAILABLE:
        raise SystemExit("the beam kernel is not built: native/beam/build.sh PYTHON")
    print(f"Beams.step, median ms per step over {args.steps} steady-state steps (beam 5)")
    print(f"{'live requests':>14} {'numpy ms':>10} {'kernel ms':>10} {'speed-up':>9}")
    for live in (5, 22, 88):
        ms = run(live, args.steps)
        print(f"{live:>14} {ms['numpy']:>10.4f} {ms['kernel']:>10.4f} "
              f"{ms['numpy'] / ms['kernel']:>8.1f}x")


if __name__ == "__main__":
    main()
