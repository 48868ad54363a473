"""Parity and batch-invariance checks of exported graphs over a grid of padded batches.

Every format (eager, onnx, torchscript) is a set of runners, one per graph. Over batch sizes
x longest lengths (mixed-length, right-padded batches) the check records

- parity: max |format - reference| per graph output (reference: eager at export time, the
  TorchScript twin in `seqserve verify`), top-k ids compared with tie tolerance;
- batch invariance: per format, max |row in the padded batch - that row run alone| /
  max(1, |row alone|) (on the row's valid positions: absolute up to magnitude 1, relative
  above) and max |padded positions| (must be zero);
- dynamic k: the decoder step run with k=1 returns column 0 of its k=5 result;
- language models: the prefill batch, then two `lm_step` calls from its states (two rows per
  prompt), parity and row invariance of each; their `state` outputs are compared relative
  above magnitude 1 (SCALED_GRAPHS);
- feature-sequence graphs: random float series whose padded steps hold random values (not
  zeros), so a row alone and the same row in a padded batch agree only when padded steps
  change nothing; a stateful graph starts from random states, and one row per batch is also
  run in two chunks (the second from the first's `new_state`), which must equal the whole
  row at once (key `GRAPH.chunked`): `new_state` is the state after the row's last valid
  step.

The decoder step runs twice per batch: from the encoder's state, then from the reference's
new state, so the recurrent inputs a first step sees as zeros (Luong input feeding starts
from o_0 = 0) are non-zero in the second and every decoder's state path is compared.

The report is JSON-ready (it goes into the manifest); `failures` lists every broken bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqserve.export.compare import (
    grid_lengths,
    max_abs,
    max_scaled,
    padded_batch,
    row_view,
    topk_id_mismatches,
)
from seqserve.export.contract import FEATURE_TASKS, GRAPHS_BY_TASK, GraphSpec
from seqserve.export.runners import Arrays, Runner
from seqserve.models.errors import BundleError

BATCH_SIZES = (1, 3, 16)
LENGTHS = (1, 7, 64)
PARITY_TOL = 1e-4
INVARIANCE_TOL = 1e-4
"""Bound on a row's relative change between running alone and in a padded batch. Float32
kernels pick their blocking by batch size, so a row moves by rounding even where nothing
leaks: torch's oneDNN kernels on an AVX-512 machine move the demo classifier's logits by
1.9e-5 (5.8e-6 with oneDNN off, 1.8e-6 in ONNX Runtime), which a 1e-5 bound refused. A
padding leak moves rows by orders of magnitude more (the leak tests' models: 0.48 to 2)."""
BEAMS = 2  # decoder-step hypothesis rows per request
SCALED_GRAPHS = ("prefill", "lm_step")
"""Graphs whose state is compared relative above magnitude 1 (`max_scaled`): a language
model's LSTM cell state is unbounded (|c| reaches tens after a long prompt), so float32
rounding over 256 steps moves it by more than 1e-4 absolute while staying ~1e-6 relative."""
TOP_K = 5


@dataclass
class _Tally:
    """Running maxima, keyed "format" -> "graph.output"."""

    parity: dict[str, dict[str, float]] = field(default_factory=dict)
    invariance: dict[str, dict[str, float]] = field(default_factory=dict)
    id_mismatches: dict[str, int] = field(default_factory=dict)
    tie_swaps: dict[str, int] = field(default_factory=dict)
    k_dynamic: dict[str, bool] = field(default_factory=dict)
    bounds: tuple[float, float] = (PARITY_TOL, INVARIANCE_TOL)
    where: str = ""
    """The batch being checked ("batch 3, longest length 7"): named by a failure."""
    first: dict[str, str] = field(default_factory=dict)
    """"parity|invariance format key" -> the batch at which that bound first broke."""

    def note(self, table: dict[str, dict[str, float]], fmt: str, key: str, value: float) -> None:
        row = table.setdefault(fmt, {})
        row[key] = max(row.get(key, 0.0), value)
        kind = "parity" if table is self.parity else "invariance"
        if not value <= self.bounds[kind == "invariance"]:
            self.first.setdefault(f"{kind} {fmt} {key}", self.where)

    def at(self, fmt: str, table: dict[str, dict[str, float]], key: str) -> str:
        kind = "parity" if table is self.parity else "invariance"
        where = self.first.get(f"{kind} {fmt} {key}")
        return f" (first at {where})" if where else ""

    def case(self, batch: int, longest: int) -> None:
        self.where = f"batch {batch}, longest length {longest}"

    def ids(self, fmt: str, bad: int, ties: int) -> None:
        self.id_mismatches[fmt] = self.id_mismatches.get(fmt, 0) + bad
        self.tie_swaps[fmt] = self.tie_swaps.get(fmt, 0) + ties


def _run(run: Runner, inputs: Arrays, fmt: str, graph: str, where: str) -> Arrays:
    """One run; a runtime's error becomes a refusal naming the batch it failed on."""
    try:
        return run(inputs)
    except Exception as exc:  # ONNX Runtime's / TorchScript's own error types
        raise BundleError(
            f"the {fmt} {graph} graph failed on a {where.replace('longest length', 'length')}"
            f" (inputs {', '.join(f'{k} {tuple(v.shape)}' for k, v in inputs.items())}): "
            f"{type(exc).__name__}: {str(exc).strip()[:300]}. It answers only some lengths "
            "or batch sizes: a size was fixed when it was exported. Export it again with "
            "that axis dynamic (torch.onnx.export(..., dynamic_shapes=...) for the default "
            "exporter, or dynamo=False with dynamic_axes=...)") from exc


@dataclass(frozen=True)
class ParityGrid:
    """What to run: grid, tolerances and seed."""

    max_length: int
    """Configured maximum input length (always part of the grid)."""
    vocab_size: int
    """Token ids are drawn from [4, vocab_size)."""
    batch_sizes: tuple[int, ...] = BATCH_SIZES  # Batch sizes (requests per batch).
    # Longest lengths per batch (those above max_length are dropped).
    lengths: tuple[int, ...] = LENGTHS
    parity_tol: float = PARITY_TOL  # Bound on |format - reference|.
    # Bound on |row in batch - row alone| and on padded outputs.
    invariance_tol: float = INVARIANCE_TOL
    pad_id: int = 0  # Padding id.
    seed: int = 0  # Seed of the generated batches.
    # Decoder-step ids are drawn from [4, target_vocab_size) (None: vocab_size).
    target_vocab_size: int | None = None
    # Lowest generated id (above seqserve's four specials; packed bundles may use 1).
    first_id: int = 4
    features: int = 0  # Feature-sequence graphs: the width of a step's feature vector.
    state_dim: int = 0  # Graphs with state (series; an LM prefill's initial_state): its width.

    def series_cases(self) -> Iterator[Arrays]:
        """Padded feature batches {features (B, T, D), lengths (B,)[, state (B, S)]} over
        batch sizes x lengths; padded steps hold random values (see module doc)."""
        rng = np.random.default_rng(self.seed)
        for longest in grid_lengths(self.lengths, self.max_length):
            for batch in self.batch_sizes:
                _, lengths = padded_batch(rng, batch, longest, 2, 0, 0)
                x = rng.standard_normal((batch, longest, self.features)).astype(np.float32)
                case: Arrays = {"features": x, "lengths": lengths}
                if self.state_dim:
                    case["state"] = (0.5 * rng.standard_normal((batch, self.state_dim))
                                     ).astype(np.float32)
                yield case

    def cases(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Padded batches (ids (B, T), lengths (B,)) over batch sizes x lengths."""
        rng = np.random.default_rng(self.seed)
        for longest in grid_lengths(self.lengths, self.max_length):
            for batch in self.batch_sizes:
                yield padded_batch(rng, batch, longest, self.vocab_size, self.pad_id,
                                   self.first_id)


def _compare_outputs(tally: _Tally, fmt: str, graph: str, spec: GraphSpec, ref: Arrays,
                     got: Arrays, tol: float) -> None:
    for out in spec.outputs:
        if out.name == "topk_ids":
            bad, ties = topk_id_mismatches(ref["topk_ids"], ref["topk_logprobs"],
                                           got["topk_ids"], got["topk_logprobs"], tol)
            tally.ids(fmt, bad, ties)
        elif graph in SCALED_GRAPHS and out.name in ("state", "new_state"):
            tally.note(tally.parity, fmt, f"{graph}.{out.name}",
                       max_scaled(got[out.name], ref[out.name]))
        else:
            tally.note(tally.parity, fmt, f"{graph}.{out.name}", max_abs(ref[out.name],
                                                                        got[out.name]))


def _row_invariance(tally: _Tally, fmt: str, graph: str, spec: GraphSpec, batch_out: Arrays,
                    row: int, length: int | None, alone: Arrays, tol: float) -> None:
    views = {out.name: row_view(out, batch_out[out.name], row, length) for out in spec.outputs}
    for out in spec.outputs:
        valid, tail = views[out.name]
        if out.name == "topk_ids":  # (1, k): compared with tie tolerance
            bad, ties = topk_id_mismatches(alone["topk_ids"], alone["topk_logprobs"], valid,
                                           views["topk_logprobs"][0], tol)
            tally.ids(fmt, bad, ties)
            continue
        diff = max_scaled(valid, alone[out.name])
        if tail.size:
            diff = max(diff, float(np.max(np.abs(tail.astype(np.float64)))))
        tally.note(tally.invariance, fmt, f"{graph}.{out.name}", diff)


def _sequence_graph(tally: _Tally, graph: str, spec: GraphSpec, runners: dict[str, Runner],
                    reference: str, ids: np.ndarray, lengths: np.ndarray, tol: float,
                    inv_tol: float, start: np.ndarray | None = None) -> Arrays:
    """classifier, encoder or prefill on one batch (a prefill that takes an initial_state:
    from `start` (B, S)): parity against reference and row invariance. Returns the reference
    outputs."""
    names = [t.name for t in spec.inputs]  # (ids, lengths) under their graph names
    extra: Arrays = {} if start is None else {"initial_state": start}
    outs = {fmt: _run(run, {names[0]: ids, names[1]: lengths, **extra}, fmt, graph,
                      tally.where) for fmt, run in runners.items()}
    for fmt, got in outs.items():
        if fmt != reference:
            _compare_outputs(tally, fmt, graph, spec, outs[reference], got, tol)
        for b, n in enumerate(lengths.tolist()):
            alone = _run(runners[fmt], {names[0]: ids[b : b + 1, :n],
                                        names[1]: lengths[b : b + 1],
                                        **{k: v[b : b + 1] for k, v in extra.items()}},
                         fmt, graph, f"batch 1, longest length {n}")
            _row_invariance(tally, fmt, graph, spec, got, b, n, alone, inv_tol)
    return outs[reference]


def _step_inputs(rng: np.random.Generator, enc: Arrays, vocab_size: int,
                 first_id: int = 4) -> Arrays:
    """Decoder-step inputs for BEAMS hypotheses per request from encoder outputs."""
    batch = enc["memory"].shape[0]
    memory_index = np.repeat(np.arange(batch, dtype=np.int64), BEAMS)  # (R,)
    return {
        "prev_ids": rng.integers(first_id, vocab_size, size=memory_index.shape[0],
                                 dtype=np.int64),
        "state": np.ascontiguousarray(enc["state"][memory_index]),  # (R, state_dim)
        "memory": enc["memory"],  # (N, S, D)
        "src_mask": enc["src_mask"],  # (N, S)
        "memory_index": memory_index,
        "k": np.array([min(TOP_K, vocab_size)], dtype=np.int64),
        **({"keys": enc["keys"]} if "keys" in enc else {}),  # (N, S, A) projected once
    }


def _decoder_step(tally: _Tally, spec: GraphSpec, runners: dict[str, Runner], reference: str,
                  inputs: Arrays, lengths: np.ndarray, tol: float, inv_tol: float) -> Arrays:
    """One step on every format: parity, row invariance, dynamic k. Returns the reference's
    outputs."""
    outs = {fmt: run(inputs) for fmt, run in runners.items()}
    for fmt, got in outs.items():
        if fmt != reference:
            _compare_outputs(tally, fmt, "decoder_step", spec, outs[reference], got, tol)
        for r, req in enumerate(inputs["memory_index"].tolist()):
            n = int(lengths[req])
            alone_in = dict(inputs, prev_ids=inputs["prev_ids"][r : r + 1],
                            state=inputs["state"][r : r + 1],
                            memory=inputs["memory"][req : req + 1, :n],
                            src_mask=inputs["src_mask"][req : req + 1, :n],
                            memory_index=np.zeros(1, dtype=np.int64))
            if "keys" in inputs:
                alone_in["keys"] = inputs["keys"][req : req + 1, :n]
            alone = runners[fmt](alone_in)
            _row_invariance(tally, fmt, "decoder_step", spec, got, r, n, alone, inv_tol)
        if fmt not in tally.k_dynamic:  # once per format: k=1 on the same graph
            one = runners[fmt](dict(inputs, k=np.array([1], dtype=np.int64)))
            tally.k_dynamic[fmt] = bool(
                one["topk_ids"].shape == (got["topk_ids"].shape[0], 1)
                and got["topk_ids"].shape[1] == int(inputs["k"][0])
                and np.array_equal(one["topk_ids"][:, 0], got["topk_ids"][:, 0])
            )
    return outs[reference]


def _lm_steps(tally: _Tally, spec: GraphSpec, runners: dict[str, Runner], reference: str,
              rng: np.random.Generator, prefill: Arrays, vocab_size: int, tol: float,
              inv_tol: float) -> None:
    """Two lm_step calls (BEAMS rows per prompt, from the reference prefill's states, then
    from the first step's new states): parity and each row alone vs in the batch."""
    index = np.repeat(np.arange(prefill["state"].shape[0], dtype=np.int64), BEAMS)  # (R,)
    inputs = {"prev_ids": rng.integers(4, vocab_size, size=index.shape[0], dtype=np.int64),
              "state": np.ascontiguousarray(prefill["state"][index])}  # (R, S)
    for _ in range(2):
        outs = {fmt: run(inputs) for fmt, run in runners.items()}
        for fmt, got in outs.items():
            if fmt != reference:
                _compare_outputs(tally, fmt, "lm_step", spec, outs[reference], got, tol)
            for r in range(index.shape[0]):
                alone = runners[fmt]({"prev_ids": inputs["prev_ids"][r : r + 1],
                                      "state": inputs["state"][r : r + 1]})
                _row_invariance(tally, fmt, "lm_step", spec, got, r, None, alone, inv_tol)
        ref = outs[reference]
        inputs = {"prev_ids": ref["log_probs"].argmax(-1).astype(np.int64),
                  "state": ref["new_state"]}


def check_parity(task: str, runners: dict[str, dict[str, Runner]], reference: str,
                 specs: dict[str, GraphSpec], grid: ParityGrid,
                 progress: bool = False) -> dict[str, Any]:
    """Run the grid for every format in `runners` (format -> graph -> runner).

    The decoder step is fed from the reference encoder's outputs, so every format sees the
    same step inputs. Returns the JSON-ready report (see module doc).
    """
    started = time.perf_counter()
    tally = _Tally(bounds=(grid.parity_tol, grid.invariance_tol))
    if task in FEATURE_TASKS:
        return _check_series(task, tally, runners, reference, specs, grid, progress, started)
    rng = np.random.default_rng(grid.seed + 1)
    cases = list(grid.cases())
    first_graph = GRAPHS_BY_TASK[task][0]
    bar = _progress(len(cases), f"parity {task}", progress)
    for ids, lengths in cases:
        tally.case(*ids.shape)
        graph_runners = {fmt: r[first_graph] for fmt, r in runners.items()}
        start = None
        if any(t.name == "initial_state" for t in specs[first_graph].inputs):
            start = (0.5 * rng.standard_normal((len(lengths), grid.state_dim))
                     ).astype(np.float32)  # a prefill from a state (a cached prefix's)
        ref_out = _sequence_graph(tally, first_graph, specs[first_graph], graph_runners,
                                  reference, ids, lengths, grid.parity_tol, grid.invariance_tol,
                                  start)
        if task == "translator":
            step_runners = {fmt: r["decoder_step"] for fmt, r in runners.items()}
            step_in = _step_inputs(rng, ref_out, grid.target_vocab_size or grid.vocab_size,
                                   grid.first_id)
            for _ in range(2):  # the second step starts from the first one's new state
                step_out = _decoder_step(tally, specs["decoder_step"], step_runners, reference,
                                         step_in, lengths, grid.parity_tol, grid.invariance_tol)
                step_in = dict(step_in, state=step_out["new_state"],
                               prev_ids=step_out["topk_ids"][:, 0].astype(np.int64))
        if task == "lm":
            _lm_steps(tally, specs["lm_step"], {fmt: r["lm_step"] for fmt, r in runners.items()},
                      reference, rng, ref_out, grid.vocab_size, grid.parity_tol,
                      grid.invariance_tol)
        bar.update(1)
    bar.close()
    return _report(task, tally, reference, list(runners), grid, len(cases),
                   time.perf_counter() - started)


def _alone(inputs: Arrays, row: int, length: int) -> Arrays:
    """Row `row` of a feature batch, cut to its length."""
    return {k: v[row : row + 1, :length] if k == "features" else v[row : row + 1]
            for k, v in inputs.items()}


def _chunked(tally: _Tally, fmt: str, graph: str, run: Runner, inputs: Arrays, row: int,
             length: int, whole: Arrays) -> None:
    """The row in two chunks (the second from the first's new_state) against `whole` (the
    row alone at once): the difference of every output, as `GRAPH.chunked`."""
    cut = max(1, length // 2)
    first = run({**_alone(inputs, row, cut), "lengths": np.array([cut], np.int64)})
    second = run({"features": inputs["features"][row : row + 1, cut:length],
                  "lengths": np.array([length - cut], np.int64),
                  "state": first["new_state"]})
    diff = max_scaled(second["new_state"], whole["new_state"])
    if whole["outputs"].ndim == 3:  # tagger: both chunks' steps
        joined = np.concatenate([first["outputs"], second["outputs"]], axis=1)
        diff = max(diff, max_scaled(joined, whole["outputs"]))
    else:
        diff = max(diff, max_scaled(second["outputs"], whole["outputs"]))
    tally.note(tally.invariance, fmt, f"{graph}.chunked", diff)


def _check_series(task: str, tally: _Tally, runners: dict[str, dict[str, Runner]],
                  reference: str, specs: dict[str, GraphSpec], grid: ParityGrid,
                  progress: bool, started: float) -> dict[str, Any]:
    graph = GRAPHS_BY_TASK[task][0]
    spec = specs[graph]
    cases = list(grid.series_cases())
    bar = _progress(len(cases), f"parity {task}", progress)
    graph_runners = {fmt: r[graph] for fmt, r in runners.items()}
    for inputs in cases:
        tally.case(*inputs["features"].shape[:2])
        outs = {fmt: _run(run, inputs, fmt, graph, tally.where)
                for fmt, run in graph_runners.items()}
        lengths = inputs["lengths"]
        for fmt, got in outs.items():
            if fmt != reference:
                _compare_outputs(tally, fmt, graph, spec, outs[reference], got,
                                 grid.parity_tol)
            run = graph_runners[fmt]
            for b, n in enumerate(lengths.tolist()):
                alone = _run(run, _alone(inputs, b, n), fmt, graph,
                             f"batch 1, longest length {n}")
                _row_invariance(tally, fmt, graph, spec, got, b, n, alone, grid.invariance_tol)
                if b == 0 and n > 1 and "state" in inputs:
                    _chunked(tally, fmt, graph, run, inputs, b, n, alone)
        bar.update(1)
    bar.close()
    return _report(task, tally, reference, list(runners), grid, len(cases),
                   time.perf_counter() - started)


class _NoBar:
    """The progress bar of a quiet check."""

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="batch", leave=False)


def _report(task: str, tally: _Tally, reference: str, formats: list[str], grid: ParityGrid,
            cases: int, seconds: float) -> dict[str, Any]:
    failures: list[str] = []
    for fmt, row in tally.parity.items():
        failures += [f"{fmt} vs {reference}: {key} differs by {v:.3g} > {grid.parity_tol:g}"
                     f"{tally.at(fmt, tally.parity, key)}"
                     for key, v in row.items() if not v <= grid.parity_tol]
    for fmt, row in tally.invariance.items():
        failures += [f"{fmt}: batch invariance of {key} broken by {v:.3g} > "
                     f"{grid.invariance_tol:g}{tally.at(fmt, tally.invariance, key)}"
                     for key, v in row.items() if not v <= grid.invariance_tol]
    failures += [f"{fmt}: {n} top-k ids differ (not near-ties)"
                 for fmt, n in tally.id_mismatches.items() if n]
    failures += [f"{fmt}: decoder_step ignores its k input (k=1 run is not column 0 of k={TOP_K})"
                 for fmt, ok in tally.k_dynamic.items() if not ok]
    return {
        "reference": reference,
        "formats": formats,
        "grid": {"batch_sizes": list(grid.batch_sizes),
                 "lengths": grid_lengths(grid.lengths, grid.max_length),
                 "batches": cases, "seed": grid.seed},
        "tolerances": {"parity": grid.parity_tol, "invariance": grid.invariance_tol},
        "parity_max_abs": tally.parity,
        "invariance_max_diff": tally.invariance,
        "topk_id_mismatches": tally.id_mismatches,
        "topk_tie_swaps": tally.tie_swaps,
        "k_dynamic": tally.k_dynamic if task == "translator" else {},
        "failures": failures,
        "first_failures": dict(tally.first),
        "passed": not failures,
        "seconds": round(seconds, 2),
    }
