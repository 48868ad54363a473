"""Wrap a user's ONNX graph into the served contract by composing ONNX graphs (no torch).

The user's graph is inlined unchanged (every name prefixed `user/`), between a few standard
operators of ours:

- tagger: LogSoftmax over the labels (a CRF tagger's emission scores: none), zeros past each
  row's length;
- encoder: src_mask from the lengths, memory zeroed past each row's length, the state tensors
  (each (layers, batch, hidden) or (batch, hidden)) flattened into one (batch, state_dim);
- decoder step: memory rows gathered by `memory_index`, the flat state split back into the
  user's tensors, then LogSoftmax + TopK(k) over the logits, the new state tensors flattened,
  and the attention passed on (zeros when the step has none);
- language model: a prefill from zero initial states, log-softmax, zeros past each row's
  length, the state tensors flattened, and, for a graph that reads no lengths, its LSTM /
  GRU / RNN nodes given them as `sequence_lens` (each row's own state); a step on one token
  per row with the flat state split back into the user's tensors.

So the served step still returns top-k only: the host never moves rows x vocabulary numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqserve.models.errors import BundleError

PREFIX = "user/"


@dataclass(frozen=True)
class StateLayout:
    """One recurrent state tensor of the user's graphs."""

    layers: int
    """Leading dim (layers x directions) for (layers, batch, hidden); 0 for (batch, hidden)."""
    hidden: int
    """Last dim."""

    @property
    def width(self) -> int:
        return max(self.layers, 1) * self.hidden

    def to_dict(self) -> dict[str, int]:
        return {"layers": self.layers, "hidden": self.hidden}


def _dims(value: Any) -> list[Any]:
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
            for d in value.type.tensor_type.shape.dim]


def state_layouts(step: Any, count: int, file: str) -> list[StateLayout]:
    """The layouts of the step's state inputs 1..count, read from their declared shapes."""
    return value_layouts(list(step.graph.input)[1:1 + count], file, rows="rows")


def value_layouts(values: list[Any], file: str, rows: str = "batch") -> list[StateLayout]:
    """The layouts of state tensors (graph inputs), read from their declared shapes (`rows`
    names their symbolic dim in the error)."""
    out = []
    for value in values:
        dims = _dims(value)
        if len(dims) == 3 and isinstance(dims[0], int) and isinstance(dims[2], int):
            out.append(StateLayout(dims[0], dims[2]))
        elif len(dims) == 2 and isinstance(dims[1], int):
            out.append(StateLayout(0, dims[1]))
        else:
            raise BundleError(
                f"{file}: state input {value.name} has shape {dims}; expected (layers, {rows}, "
                f"hidden) or ({rows}, hidden) with layers and hidden fixed numbers and {rows} "
                f"symbolic (export with dynamic_axes on its {rows} dim only)")
    return out


def user_inputs(model: Any) -> list[Any]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def _opset(model: Any) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _prefix_outer_references(graph: Any, outer: set[str]) -> None:
    """`onnx.compose.add_prefix` renames a graph's names but not the references a subgraph
    (a Loop's or an If's body: a length-aware RNN exports as a Loop) makes to the outer
    graph's names: prefix those too, recursively."""
    here = set(outer) | {t.name for t in graph.initializer} | {v.name for v in graph.input}
    here |= {o for n in graph.node for o in n.output}
    for node in graph.node:
        for attr in node.attribute:
            subs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
            for sub in subs:
                own = {t.name for t in sub.initializer} | {v.name for v in sub.input}
                own |= {o for n in sub.node for o in n.output}
                for inner in sub.node:
                    for i, name in enumerate(inner.input):
                        if name and name not in own and name not in here \
                                and PREFIX + name in here:
                            inner.input[i] = PREFIX + name
                for out in sub.output:
                    if out.name not in own and out.name not in here and PREFIX + out.name in here:
                        out.name = PREFIX + out.name
                _prefix_outer_references(sub, here)


class _Builder:
    """Nodes, initializers and value infos of the composed graph."""

    def __init__(self, user: Any) -> None:
        import onnx
        from onnx import compose

        self.onnx = onnx
        self.h = onnx.helper
        if _opset(user) < 13:
            raise BundleError(f"the graph uses opset {_opset(user)}; export it with opset 13 "
                              "or newer (opset_version=17)")
        self.user = compose.add_prefix(user, PREFIX, rename_functions=False)
        _prefix_outer_references(self.user.graph, set())
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._pre: list[Any] = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"pack/{base}_{self._n}"

    def const(self, base: str, values: list[int] | list[float], dtype: str = "int64") -> str:
        import numpy as np

        n = self.name(base)
        arr = np.array(values, dtype=np.int64 if dtype == "int64" else np.float32)
        self.inits.append(self.onnx.numpy_helper.from_array(arr, n))
        return n

    def op(self, op: str, inputs: list[str], outputs: list[str] | None = None,
           n_out: int = 1, **attrs: Any) -> list[str]:
        outs = outputs or [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(self.h.make_node(op, inputs, outs, name=self.name(op), **attrs))
        return outs

    def one(self, op: str, inputs: list[str], output: str | None = None, **attrs: Any) -> str:
        return self.op(op, inputs, [output] if output else None, **attrs)[0]

    def model(self, inputs: list[Any], outputs: list[Any]) -> Any:
        g = self.user.graph
        graph = self.h.make_graph(self._pre + list(g.node) + self.nodes,
                                  "seqserve_packed", inputs, outputs,
                                  initializer=list(g.initializer) + self.inits,
                                  value_info=list(g.value_info))
        m = self.h.make_model(graph, opset_imports=list(self.user.opset_import),
                              functions=list(self.user.functions))
        m.ir_version = self.user.ir_version
        self.onnx.checker.check_model(m)
        return m

    def split_pre(self) -> None:
        """Everything added so far runs before the user's graph."""
        self._pre, self.nodes = self.nodes, []

    # -- pieces ---------------------------------------------------------------------------

    def length_mask(self, ids: str, lengths: str, axis_len: int = 1) -> str:
        """(B, T) bool: position < length."""
        shape = self.one("Shape", [ids])
        t = self.one("Gather", [shape, self.const("axis", [axis_len])])  # (1,)
        t0 = self.one("Squeeze", [t, self.const("ax0", [0])])
        rng = self.one("Range", [self._scalar(0), t0, self._scalar(1)])  # (T,)
        row = self.one("Unsqueeze", [rng, self.const("ax0", [0])])  # (1, T)
        col = self.one("Unsqueeze", [lengths, self.const("ax1", [1])])  # (B, 1)
        return self.one("Less", [row, col])

    def _scalar(self, value: int) -> str:
        import numpy as np

        n = self.name("scalar")
        self.inits.append(self.onnx.numpy_helper.from_array(np.array(value, np.int64), n))
        return n

    def flatten(self, tensors: list[str], layouts: list[StateLayout], output: str) -> str:
        parts = []
        for t, lay in zip(tensors, layouts, strict=True):
            if lay.layers:
                t = self.one("Transpose", [t], perm=[1, 0, 2])  # (B, L, H)
                t = self.one("Reshape", [t, self.const("shape", [0, lay.width])])
            parts.append(t)
        if len(parts) == 1:
            return self.one("Identity", parts, output)
        return self.one("Concat", parts, output, axis=1)

    def unflatten(self, state: str, layouts: list[StateLayout], names: list[str]) -> None:
        offset = 0
        for lay, name in zip(layouts, names, strict=True):
            part = self.one("Slice", [state, self.const("start", [offset]),
                                      self.const("end", [offset + lay.width]),
                                      self.const("axes", [1])])
            offset += lay.width
            if lay.layers:
                part = self.one("Reshape", [part, self.const("shape", [0, lay.layers,
                                                                       lay.hidden])])
                self.one("Transpose", [part], name, perm=[1, 0, 2])
            else:
                self.one("Identity", [part], name)


def _vi(name: str, elem: int, dims: list[Any]) -> Any:
    import onnx

    return onnx.helper.make_tensor_value_info(name, elem, dims)


F32, I64, BOOL = 1, 7, 9


def _cast_to(b: _Builder, src: str, value: Any, target: str) -> None:
    """Feed the user's input `target` from our tensor `src`, cast to its dtype."""
    elem = value.type.tensor_type.elem_type
    b.one("Cast", [src], target, to=elem)


def compose_tagger(user: Any, inputs: list[str], output: str, normalize: bool = True) -> Any:
    """Tagger: user (ids, lengths) -> logits (B, T, C) becomes the contract's log_probs (with
    `normalize` False, a CRF tagger's emission scores: as they are, cast to float)."""
    b = _Builder(user)
    ins = {v.name: v for v in user_inputs(user)}
    _cast_to(b, "input_ids", ins[inputs[0]], PREFIX + inputs[0])
    _cast_to(b, "lengths", ins[inputs[1]], PREFIX + inputs[1])
    b.split_pre()
    lp = (b.one("LogSoftmax", [PREFIX + output], axis=-1) if normalize else
          b.one("Cast", [PREFIX + output], to=F32))
    mask = b.one("Unsqueeze", [b.length_mask("input_ids", "lengths"), b.const("ax", [2])])
    b.one("Where", [mask, lp, b.const("zero", [0.0], "float32")], "log_probs")
    return b.model([_vi("input_ids", I64, ["batch", "seq"]), _vi("lengths", I64, ["batch"])],
                   [_vi("log_probs", F32, ["batch", "seq", "labels"])])


def compose_encoder(user: Any, layouts: list[StateLayout]) -> Any:
    """Encoder: user (ids, lengths) -> (memory (B, S, D), state tensors...)."""
    b = _Builder(user)
    ins = user_inputs(user)
    outs = [o.name for o in user.graph.output]
    if len(outs) != 1 + len(layouts):
        raise BundleError(f"encoder: outputs {outs}: expected memory then the "
                          f"{len(layouts)} state tensor(s) the decoder step takes")
    _cast_to(b, "src_ids", ins[0], PREFIX + ins[0].name)
    _cast_to(b, "src_lengths", ins[1], PREFIX + ins[1].name)
    b.split_pre()
    mask = b.length_mask("src_ids", "src_lengths")
    b.one("Identity", [mask], "src_mask")
    m = b.one("Cast", [b.one("Unsqueeze", [mask, b.const("ax", [2])])], to=F32)
    mem = b.one("Cast", [PREFIX + outs[0]], to=F32)
    b.one("Mul", [mem, m], "memory")
    states = [b.one("Cast", [PREFIX + o], to=F32) for o in outs[1:]]
    b.flatten(states, layouts, "state")
    return b.model(
        [_vi("src_ids", I64, ["batch", "src_len"]), _vi("src_lengths", I64, ["batch"])],
        [_vi("memory", F32, ["batch", "src_len", "mem_dim"]),
         _vi("src_mask", BOOL, ["batch", "src_len"]), _vi("state", F32, ["batch", "state_dim"])])


def compose_step(user: Any, layouts: list[StateLayout]) -> tuple[Any, bool]:
    """Decoder step: user (prev_ids, state..., memory rows (R, S, D), mask rows (R, S)) ->
    (logits (R, V), new state..., [attention (R, S)]). Returns (model, has_attention)."""
    b = _Builder(user)
    ins = user_inputs(user)
    n = len(layouts)
    if len(ins) != n + 3:
        raise BundleError(f"decoder step: inputs {[v.name for v in ins]}: expected prev_ids, "
                          f"{n} state tensor(s), memory, mask")
    outs = [o.name for o in user.graph.output]
    if len(outs) not in (n + 1, n + 2):
        raise BundleError(f"decoder step: outputs {outs}: expected logits, {n} new state "
                          "tensor(s) and optionally attention")
    attention = len(outs) == n + 2
    _cast_to(b, "prev_ids", ins[0], PREFIX + ins[0].name)
    flat = b.one("Identity", ["state"])
    b.unflatten(flat, layouts, [PREFIX + v.name for v in ins[1:1 + n]])
    mem = b.one("Gather", ["memory", "memory_index"], axis=0)  # (R, S, D)
    _cast_to(b, mem, ins[n + 1], PREFIX + ins[n + 1].name)
    mask = b.one("Gather", ["src_mask", "memory_index"], axis=0)  # (R, S)
    _cast_to(b, mask, ins[n + 2], PREFIX + ins[n + 2].name)
    b.split_pre()
    logits = b.one("Cast", [PREFIX + outs[0]], to=F32)
    lp = b.one("LogSoftmax", [logits], axis=-1)
    b.op("TopK", [lp, "k"], ["topk_logprobs", "topk_ids"], axis=-1, largest=1, sorted=1)
    states = [b.one("Cast", [PREFIX + o], to=F32) for o in outs[1:1 + n]]
    b.flatten(states, layouts, "new_state")
    if attention:
        b.one("Cast", [PREFIX + outs[-1]], "attention", to=F32)
    else:
        shape = b.one("Shape", [mask])
        zero = b.onnx.helper.make_tensor("zero", F32, [1], [0.0])
        b.one("ConstantOfShape", [shape], "attention", value=zero)
    model = b.model(
        [_vi("prev_ids", I64, ["rows"]), _vi("state", F32, ["rows", "state_dim"]),
         _vi("memory", F32, ["batch", "src_len", "mem_dim"]),
         _vi("src_mask", BOOL, ["batch", "src_len"]), _vi("memory_index", I64, ["rows"]),
         _vi("k", I64, [1])],
        [_vi("new_state", F32, ["rows", "state_dim"]), _vi("topk_logprobs", F32, ["rows", "k"]),
         _vi("topk_ids", I64, ["rows", "k"]), _vi("attention", F32, ["rows", "src_len"])])
    return model, attention


def compose_series(user: Any, inputs: list[str], outputs: list[str],
                   layouts: list[StateLayout], tagger: bool) -> Any:
    """Feature sequence: user (features, lengths[, state...]) -> (outputs[, new state...])
    (`inputs[1]` "" for a graph without a lengths input)
    becomes the contract's (features, lengths[, state]) -> (outputs[, new_state]): float32
    outputs (a tagger's zeroed past each row's length), the state tensors flattened."""
    b = _Builder(user)
    ins = {v.name: v for v in user_inputs(user)}
    _cast_to(b, "features", ins[inputs[0]], PREFIX + inputs[0])
    if inputs[1]:  # "": the user's graph does not read lengths (we still mask by them)
        _cast_to(b, "lengths", ins[inputs[1]], PREFIX + inputs[1])
    if layouts:
        b.unflatten(b.one("Identity", ["state"]), layouts, [PREFIX + n for n in inputs[2:]])
    b.split_pre()
    out = b.one("Cast", [PREFIX + outputs[0]], to=F32)
    if tagger:
        mask = b.one("Unsqueeze", [b.length_mask("features", "lengths"), b.const("ax", [2])])
        b.one("Where", [mask, out, b.const("zero", [0.0], "float32")], "outputs")
    else:
        b.one("Identity", [out], "outputs")
    graph_in = [_vi("features", F32, ["batch", "time", "feature_dim"]),
                _vi("lengths", I64, ["batch"])]
    graph_out = [_vi("outputs", F32, ["batch", "time", "out_dim"] if tagger
                     else ["batch", "out_dim"])]
    if layouts:
        states = [b.one("Cast", [PREFIX + o], to=F32) for o in outputs[1:]]
        b.flatten(states, layouts, "new_state")
        graph_in.append(_vi("state", F32, ["batch", "state_dim"]))
        graph_out.append(_vi("new_state", F32, ["batch", "state_dim"]))
    return b.model(graph_in, graph_out)


# -- language models ------------------------------------------------------------------------

RNN_OPS = ("LSTM", "GRU", "RNN")
"""ONNX recurrent operators: input 4 is `sequence_lens`; with it, Y_h (and an LSTM's Y_c) is
each row's state after its own last valid step and Y is zero past it."""


@dataclass(frozen=True)
class LMGraphNames:
    """One user LM graph's tensors in the contract's roles (the graph's own names)."""

    ids: str
    """Token ids: (batch, seq) or (seq, batch) for a prefill; (rows,), (1, rows) or (rows, 1)
    for a step."""
    lengths: str | None
    """Lengths (batch,) int input, or None: the graph reads none."""
    states: list[str]
    """State inputs (the step: always; a prefill: none or the same count)."""
    logits: str
    """Logits or log-probs: (batch, seq, V), (seq, batch, V), (seq*batch, V) or (rows, V)."""
    new_states: list[str]
    """State outputs, in the order of `states` (the step's state inputs)."""
    time_major: bool
    """Whether the ids' axis 0 is time (a (seq, batch) graph, nn.LSTM's default layout)."""


def _value(model: Any, name: str, outputs: bool = False) -> Any:
    values = model.graph.output if outputs else user_inputs(model)
    return next(v for v in values if v.name == name)


def _rank(value: Any) -> int:
    return len(value.type.tensor_type.shape.dim)


def check_lm_layouts(model: Any, names: list[str], layouts: list[StateLayout], file: str,
                     what: str, outputs: bool) -> None:
    """Declared fixed sizes of a graph's state tensors against the step's layouts."""
    for name, lay in zip(names, layouts, strict=True):
        dims = _dims(_value(model, name, outputs))
        want = [lay.layers, "*", lay.hidden] if lay.layers else ["*", lay.hidden]
        ok = len(dims) == len(want) and all(not isinstance(d, int) or w == "*" or d == w
                                            for d, w in zip(dims, want, strict=True))
        if not ok:
            raise BundleError(
                f"{file}: {what} state {name} has shape {dims} but the step's state is "
                f"{want} ('*': rows) in that position: the prefill's and the step's state "
                "tensors must have the same sizes, in the same order")


def bind_sequence_lens(nodes: list[Any], lens: str, file: str) -> None:
    """Feed int32 lengths `lens` to recurrent nodes as their `sequence_lens` (input 4)."""
    for node in nodes:
        if len(node.input) > 4 and node.input[4]:
            raise BundleError(f"{file}: recurrent node {node.name} already has sequence_lens; "
                              "name the graph's lengths input with --prefill-input-names")
        ins = list(node.input) + [""] * (5 - len(node.input))
        ins[4] = lens
        del node.input[:]
        node.input.extend(ins)


def with_sequence_lens(model: Any, lengths: str, file: str) -> Any:
    """`model` (a prefill exported from native nn.LSTM / GRU / RNN layers, input `lengths`
    (batch,) int64) with its recurrent nodes given the lengths as `sequence_lens`: the state
    they return is each row's own after its last valid step."""
    import onnx

    nodes = [n for n in model.graph.node if n.op_type in RNN_OPS and n.domain in ("", "ai.onnx")]
    if not nodes:
        raise BundleError(f"{file}: the exported prefill has no ONNX LSTM / GRU / RNN node, so "
                          "its state would be the one after the batch's padding: seqserve.pack"
                          ".lm runs the module's nn.LSTM / nn.GRU / nn.RNN layers within each "
                          "prompt's length through them")
    lens = "pack/sequence_lens"
    model.graph.node.insert(0, onnx.helper.make_node("Cast", [lengths], [lens], to=6,
                                                     name="pack/Cast_sequence_lens"))
    bind_sequence_lens(nodes, lens, file)
    onnx.checker.check_model(model)
    return model


def compose_prefill(user: Any, names: LMGraphNames, layouts: list[StateLayout],
                    file: str) -> Any:
    """LM prefill: the user's sequence graph (ids[, lengths][, initial state...]) ->
    (logits, state...) becomes the contract's (input_ids, lengths[, initial_state]) -> (state
    after each row's last token, log_probs zero past each row's length). A graph that takes
    its initial states takes them as the contract's flat `initial_state` (a cached prefix's
    or a client's state continues in one call); one without starts from zeros. A graph
    without a lengths input gets one through its recurrent nodes' `sequence_lens` (the state
    it returns is then each row's own); a graph with neither is refused."""
    b = _Builder(user)
    shape = b.one("Shape", ["input_ids"])
    batch = b.one("Gather", [shape, b.const("axis", [0])])  # (1,)
    seq = b.one("Gather", [shape, b.const("axis", [1])])  # (1,)
    ids = b.one("Transpose", ["input_ids"], perm=[1, 0]) if names.time_major else "input_ids"
    _cast_to(b, ids, _value(user, names.ids), PREFIX + names.ids)
    if names.lengths is not None:
        _cast_to(b, "lengths", _value(user, names.lengths), PREFIX + names.lengths)
    else:
        nodes = [n for n in b.user.graph.node if n.op_type in RNN_OPS
                 and n.domain in ("", "ai.onnx")]
        if not nodes:
            raise BundleError(
                f"{file}: the prefill graph reads no lengths and has no ONNX LSTM / GRU / RNN "
                "node, so the state it returns is the one after the batch's padding, not after "
                "each prompt's last token. Export it with a lengths input and return each "
                "row's state at its length (seqserve.pack.length_aware(your_rnn) does that), "
                "or pack the module with seqserve.pack.lm")
        bind_sequence_lens(nodes, b.one("Cast", ["lengths"], to=6), file)  # int32
    takes_state = bool(names.states)  # the graph's own initial states: the contract's
    if takes_state:  # initial_state (schema 3), split into them; else they are zeros
        b.unflatten(b.one("Identity", ["initial_state"]), layouts,
                    [PREFIX + n for n in names.states])
    b.split_pre()
    logits = PREFIX + names.logits
    rank = _rank(_value(user, names.logits, outputs=True))
    if rank == 2:  # flattened (seq*batch, V) or (batch*seq, V), as the tutorial's view(-1, V)
        first, second = (seq, batch) if names.time_major else (batch, seq)
        logits = b.one("Reshape", [logits, b.one("Concat", [first, second,
                                                            b.const("v", [-1])], axis=0)])
    elif rank != 3:
        raise BundleError(f"{file}: prefill output {names.logits} has rank {rank}; expected "
                          "logits (batch, seq, vocab), (seq, batch, vocab) or (seq*batch, "
                          "vocab)")
    if names.time_major:
        logits = b.one("Transpose", [logits], perm=[1, 0, 2])
    lp = b.one("LogSoftmax", [b.one("Cast", [logits], to=F32)], axis=-1)
    mask = b.one("Unsqueeze", [b.length_mask("input_ids", "lengths"), b.const("ax", [2])])
    b.one("Where", [mask, lp, b.const("zero", [0.0], "float32")], "log_probs")
    states = [b.one("Cast", [PREFIX + o], to=F32) for o in names.new_states]
    b.flatten(states, layouts, "state")
    inputs = [_vi("input_ids", I64, ["batch", "seq"]), _vi("lengths", I64, ["batch"])]
    if takes_state:
        inputs.append(_vi("initial_state", F32, ["batch", "state_dim"]))
    return b.model(inputs, [_vi("state", F32, ["batch", "state_dim"]),
                            _vi("log_probs", F32, ["batch", "seq", "vocab"])])


def compose_lm_step(user: Any, names: LMGraphNames, layouts: list[StateLayout],
                    file: str) -> Any:
    """LM step: the user's graph (ids[, lengths], state...) -> (logits, new state...) run on
    one token per row becomes the contract's (prev_ids, state) -> (new_state, log_probs)."""
    b = _Builder(user)
    value = _value(user, names.ids)
    rank = _rank(value)
    if rank == 1:
        ids = "prev_ids"
    elif rank == 2:  # a sequence graph run on one step: (1, rows) or (rows, 1)
        ids = b.one("Unsqueeze", ["prev_ids", b.const("ax", [0 if names.time_major else 1])])
    else:
        raise BundleError(f"{file}: step input {names.ids} has rank {rank}; expected token "
                          "ids (rows,), (1, rows) or (rows, 1)")
    _cast_to(b, ids, value, PREFIX + names.ids)
    if names.lengths is not None:  # one token per row
        one = b.onnx.helper.make_tensor(b.name("one"), I64, [1], [1])
        ones = b.one("ConstantOfShape", [b.one("Shape", ["prev_ids"])], value=one)
        _cast_to(b, ones, _value(user, names.lengths), PREFIX + names.lengths)
    b.unflatten(b.one("Identity", ["state"]), layouts, [PREFIX + n for n in names.states])
    b.split_pre()
    logits = PREFIX + names.logits
    out_rank = _rank(_value(user, names.logits, outputs=True))
    if out_rank == 3:
        logits = b.one("Squeeze", [logits, b.const("ax", [0 if names.time_major else 1])])
    elif out_rank != 2:
        raise BundleError(f"{file}: step output {names.logits} has rank {out_rank}; expected "
                          "logits (rows, vocab), (1, rows, vocab) or (rows, 1, vocab)")
    b.one("LogSoftmax", [b.one("Cast", [logits], to=F32)], "log_probs", axis=-1)
    states = [b.one("Cast", [PREFIX + o], to=F32) for o in names.new_states]
    b.flatten(states, layouts, "new_state")
    return b.model([_vi("prev_ids", I64, ["rows"]), _vi("state", F32, ["rows", "state_dim"])],
                   [_vi("new_state", F32, ["rows", "state_dim"]),
                    _vi("log_probs", F32, ["rows", "vocab"])])
