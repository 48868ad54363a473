"""`seqserve pack TASK` from files: the user's ONNX graphs (either PyTorch exporter, external
data included) and optional TorchScript twins -> `pack_bundle`.

Classifier graphs are kept as exported (their tensor names mapped onto the contract's in
the manifest); tagger, translator, language-model and feature-sequence graphs are wrapped by
composing ONNX graphs (`onnx_compose`). TorchScript twins are wrapped alike in torch
(`torch_wrap`) and traced.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seqserve.export.pack.bundle import (
    PackedGraph,
    pack_bundle,
    pack_series_bundle,
    parse_crf,
    parse_labels,
    series_labels,
)
from seqserve.export.pack.onnx_compose import (
    LMGraphNames,
    _dims,
    check_lm_layouts,
    compose_encoder,
    compose_lm_step,
    compose_prefill,
    compose_series,
    compose_step,
    compose_tagger,
    state_layouts,
    user_inputs,
    value_layouts,
)
from seqserve.models.errors import BundleError, UserError
from seqserve.models.text.chat_template import read_template

PathLike = str | os.PathLike[str]


def _load(path: PathLike | None, what: str) -> Any:
    import onnx

    if path is None:
        raise UserError(f"{what}: give the ONNX file")
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such ONNX file")
    try:
        model = onnx.load(str(p))  # external data files beside it are read in
    except Exception as exc:  # onnx's own errors (a missing .data file, a bad proto)
        raise UserError(f"{p}: cannot read the ONNX graph (and its external data files, "
                        f"which must lie beside it under the names it records): {exc}") from exc
    return model


def _names(given: str | None, actual: list[str], count: tuple[int, ...], what: str,
           contract: list[str], file: PathLike | None = None) -> list[str]:
    """The user's tensor names in the contract's order (`--input-names`/`--output-names`, or
    the graph's own in order); UserError naming `file` and its tensors when they do not fit."""
    where = f"{Path(str(file)).name}: " if file is not None else ""
    side = "inputs" if what.endswith("input-names") else "outputs"
    if given:
        names = [n.strip() for n in given.split(",") if n.strip()]
        unknown = [n for n in names if n not in actual]
        if unknown:
            raise UserError(f"{where}--{what} {unknown}: not in the graph, whose {side} are "
                            f"{actual}")
    else:
        names = actual
    if len(names) not in count:
        counted = " or ".join(map(str, count))
        lost = ""
        if side == "inputs" and contract[1:2] == ["lengths"] and len(names) == 1:
            lost = ("; your graph has no lengths input: torch.onnx.export drops an input "
                    "that forward never reads, so a model that ignores its lengths loses it. "
                    "Use it (e.g. zero the outputs past each row's length) and export again")
        raise UserError(f"{where}the graph's {side} are {names}; expected {counted}, in the "
                        f"contract's order {contract} (map yours with --{what}){lost}")
    return names


def _ts(path: PathLike | None) -> Any:
    if path is None:
        return None
    import torch

    if not Path(path).is_file():
        raise UserError(f"{path}: no such TorchScript file")
    return torch.jit.load(str(path), map_location="cpu").eval()


def _trace(wrap: Any, example: tuple[Any, ...]) -> Any:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(wrap.eval(), example, check_trace=False)


def pack_series_files(task: str, *, repo: PathLike, name: str, onnx: PathLike | None,
                      features: int, torchscript: PathLike | None = None,
                      labels: Any = None, outputs: int | None = None,
                      normalization: Any = None, output_scale: Any = None,
                      input_names: str | None = None, output_names: str | None = None,
                      version: int | None = None, max_steps: int = 128,
                      progress: bool = True) -> Path:
    """`seqserve pack sequence-classifier|sequence-tagger`: the user's ONNX graph
    (features, lengths[, state tensors...]) -> (outputs[, new state tensors...]) composed into
    the contract (`onnx_compose.compose_series`), its TorchScript twin wrapped alike."""
    import torch

    from seqserve.export.pack.torch_wrap import (
        SeriesWrap,
        StatefulSeriesWrap,
        StateTree,
        example_series,
    )

    model = _load(onnx, "--onnx")
    actual = [v.name for v in user_inputs(model)]
    ins = _names(input_names, actual, tuple(range(1, max(3, len(actual) + 1))), "input-names",
                 ["features", "lengths", "state..."], onnx)
    if len(ins) == 1:  # a graph that never reads its lengths (the exporter dropped them)
        ins = [ins[0], ""]
    n_state = len(ins) - 2
    by_name = {v.name: v for v in user_inputs(model)}
    second = by_name.get(ins[1])
    if second is not None and second.type.tensor_type.elem_type == 1:  # FLOAT: not lengths
        raise UserError(
            f"{Path(str(onnx)).name}: your graph has no lengths input: its inputs are "
            f"{ins}, and {ins[1]!r} is float (a state?); the contract reads (features, "
            "lengths, state...). Export the model with a lengths input (int64 [batch], each "
            "row's own number of steps) and, for a stateful one, wrap its nn.GRU / nn.LSTM "
            "with seqserve.pack.length_aware(rnn) so that the state it returns is each row's "
            "after its own last step; name the inputs with --input-names if needed")
    outs = _names(output_names, [o.name for o in model.graph.output], (1 + n_state,),
                  "output-names", ["outputs"] + ["new state..."] * bool(n_state), onnx)
    layouts = value_layouts([by_name[n] for n in ins[2:]], str(onnx))
    tagger = task == "sequence-tagger"
    contract = ["outputs", "new_state"] if layouts else ["outputs"]
    graph = PackedGraph(contract, compose_series(model, ins, outs, layouts, tagger))
    ts = _ts(torchscript)
    if ts is not None:
        x, lengths = example_series(features)
        if layouts:
            tree = StateTree(tuple(0 for _ in layouts), tuple(layouts))
            width = sum(lay.width for lay in layouts)
            graph.torchscript = _trace(StatefulSeriesWrap(ts, tagger, tree),
                                       (x, lengths, torch.zeros(x.shape[0], width)))
        else:
            graph.torchscript = _trace(SeriesWrap(ts, tagger), (x, lengths))
    names = series_labels(labels, outputs, flags=True)
    source: dict[str, Any] = {"packed_by": "seqserve pack", "task": task, "onnx": str(onnx),
                              "torchscript": None if torchscript is None else str(torchscript),
                              "input_names": ins, "output_names": outs,
                              "state": [x.to_dict() for x in layouts]}
    return pack_series_bundle(task, graph, repo, name, features=features,
                              outputs=outputs if outputs is not None else len(names),
                              labels=names, normalization=normalization,
                              output_scale=output_scale,
                              state_dim=sum(x.width for x in layouts) or None,
                              version=version, max_steps=max_steps, source=source,
                              progress=progress)


def pack_files(task: str, *, repo: PathLike, name: str, tokenizer: PathLike | None = None,
               labels: Any = None, onnx: PathLike | None = None,
               torchscript: PathLike | None = None, encoder: PathLike | None = None,
               decoder_step: PathLike | None = None,
               encoder_torchscript: PathLike | None = None,
               decoder_step_torchscript: PathLike | None = None,
               source_tokenizer: PathLike | None = None,
               target_tokenizer: PathLike | None = None, input_names: str | None = None,
               output_names: str | None = None, version: int | None = None,
               specials: dict[str, Any] | None = None,
               target_specials: dict[str, Any] | None = None, max_tokens: int = 128,
               max_decode_length: int = 128, progress: bool = True,
               words: str = "whitespace", crf: PathLike | None = None) -> Path:
    """Pack files as bundle `repo/name/version` (see module doc and `seqserve pack --help`).
    `words` (taggers): the unit labelled, "whitespace" or "tokenizer" (`Manifest.words`).
    `crf` (taggers): a file of the tagger's CRF scores (`bundle.parse_crf`): its graph's
    output is then the emission scores, kept as they are and decoded with Viterbi.
    `specials` name the special tokens of `tokenizer` / `source_tokenizer`, `target_specials`
    those of `target_tokenizer` (a translator with separate vocabularies only)."""
    from seqserve.models.text.tokenizer_files import special_ids

    common: dict[str, Any] = {"version": version, "max_tokens": max_tokens,
                              "progress": progress}
    if task in ("classifier", "tagger"):
        if tokenizer is None:
            raise UserError("--tokenizer is required (tokenizer.json or a SentencePiece .model)")
        model = _load(onnx, "--onnx")
        ins = _names(input_names, [v.name for v in user_inputs(model)], (2,), "input-names",
                     ["input_ids", "lengths"], onnx)
        outs = _names(output_names, [o.name for o in model.graph.output],
                      (1, 2) if task == "classifier" else (1,), "output-names",
                      ["logits", "attention"] if task == "classifier" else ["logits"], onnx)
        vocab = special_ids(tokenizer, specials).vocab_size
        source: dict[str, Any] = {"packed_by": "seqserve pack", "task": task,
                                  "onnx": str(onnx),
                  "torchscript": None if torchscript is None else str(torchscript),
                  "input_names": ins, "output_names": outs}
        ts = _ts(torchscript)
        if task == "classifier":
            from_contract = ["logits", "attention"][:len(outs)]
            mapping = {c: u for c, u in zip(["input_ids", "lengths"], ins, strict=True)}
            mapping |= {c: u for c, u in zip(from_contract, outs, strict=True)}
            mapping = {c: u for c, u in mapping.items() if c != u}
            twin = None
            if ts is not None:
                from seqserve.export.pack.torch_wrap import ClassifierWrap, example_ids

                twin = _trace(ClassifierWrap(ts, len(outs) == 2), example_ids(vocab))
            graph = PackedGraph(from_contract, model, twin, mapping)
        else:
            scores = None if crf is None else parse_crf(crf)
            if scores is not None:
                source["crf"] = str(crf)
            twin = None
            if ts is not None:
                from seqserve.export.pack.torch_wrap import TaggerWrap, example_ids

                twin = _trace(TaggerWrap(ts, normalize=scores is None), example_ids(vocab))
            graph = PackedGraph(["log_probs"], compose_tagger(model, ins, outs[0],
                                                              normalize=scores is None), twin)
        return pack_bundle(task, {task: graph}, tokenizer, repo, name,
                           labels=parse_labels(labels or []), specials=specials,
                           source=source, words=words if task == "tagger" else None,
                           crf=scores if task == "tagger" else None, **common)
    if task != "translator":
        raise UserError(f"unknown task {task!r}: classifier, tagger or translator")
    src = source_tokenizer or tokenizer
    if src is None:
        raise UserError("give --tokenizer (joint) or --source-tokenizer and --target-tokenizer")
    if (source_tokenizer is None) != (target_tokenizer is None):
        raise UserError("--source-tokenizer and --target-tokenizer go together")
    if source_tokenizer is None and any(v is not None for v in (target_specials or {}).values()):
        raise UserError("--target-*-token options name the special tokens of "
                        "--target-tokenizer; with one joint --tokenizer use --pad-token, "
                        "--unk-token, --bos-token and --eos-token")
    enc, step = _load(encoder, "--encoder"), _load(decoder_step, "--decoder-step")
    n = len(user_inputs(step)) - 3
    if n < 1:
        raise BundleError(f"--decoder-step: inputs {[v.name for v in user_inputs(step)]}: "
                          "expected prev_ids, the state tensor(s), memory, mask")
    layouts = state_layouts(step, n, str(decoder_step))
    step_model, attention = compose_step(step, layouts)
    graphs = {"encoder": PackedGraph(["memory", "src_mask", "state"],
                                     compose_encoder(enc, layouts)),
              "decoder_step": PackedGraph(["new_state", "topk_logprobs", "topk_ids",
                                           "attention"], step_model)}
    if (encoder_torchscript is None) != (decoder_step_torchscript is None):
        raise UserError("--encoder-torchscript and --decoder-step-torchscript go together")
    if encoder_torchscript is not None:
        _twins(graphs, _ts(encoder_torchscript), _ts(decoder_step_torchscript), layouts,
               attention, special_ids(src, specials).vocab_size)
    source = {"packed_by": "seqserve pack", "task": task, "encoder": str(encoder),
              "decoder_step": str(decoder_step), "state": [x.to_dict() for x in layouts],
              "step_attention": attention}
    return pack_bundle("translator", graphs, src, repo, name,
                       target_tokenizer=target_tokenizer if source_tokenizer else None,
                       specials=specials,
                       target_specials=target_specials if source_tokenizer else None,
                       source=source,
                       max_decode_length=max_decode_length, attention=attention, **common)


def _twins(graphs: dict[str, PackedGraph], enc: Any, step: Any, layouts: list[Any],
           attention: bool, vocab: int) -> None:
    import torch

    from seqserve.export.pack.torch_wrap import EncoderWrap, StateTree, StepWrap, example_ids

    tree = StateTree(tuple(0 for _ in layouts), tuple(layouts))
    enc_wrap = EncoderWrap(enc, tree, enc)
    ids, lengths = example_ids(vocab)
    with torch.no_grad():
        memory, mask, state = enc_wrap(ids, lengths)
    index = torch.tensor([0, 0, 1, 2, 2])
    prev = torch.ones(5, dtype=torch.int64)
    graphs["encoder"].torchscript = _trace(enc_wrap, (ids, lengths))
    graphs["decoder_step"].torchscript = _trace(
        StepWrap(step, tree, attention, step),
        (prev, state[index], memory, mask, index, torch.tensor([2])))


_INT_TYPES = (2, 3, 4, 5, 6, 7, 12, 13)
"""onnx.TensorProto integer element types (uint8 ... uint64)."""
LAYOUTS = ("auto", "batch-first", "time-major")


def _is_lengths(value: Any) -> bool:
    tt = value.type.tensor_type
    return tt.elem_type in _INT_TYPES and len(tt.shape.dim) == 1


def _time_major(model: Any, ids: str, states: list[str], layout: str, file: str) -> bool:
    """Whether the graph's token ids are (seq, batch): from --layout, else from the batch dim
    the ids share with the state tensors, else from a fixed 1 (a step exported for one
    token)."""
    if layout != "auto":
        return layout == "time-major"

    dims = _dims(next(v for v in user_inputs(model) if v.name == ids))
    if len(dims) != 2:
        return False
    values = [v for v in [*user_inputs(model), *model.graph.output] if v.name in states]
    batch = set()
    for v in values:
        d = _dims(v)
        axis = 1 if len(d) == 3 else 0
        if len(d) in (2, 3) and isinstance(d[axis], str) and d[axis]:
            batch.add(d[axis])
    hits = [i for i, d in enumerate(dims) if d in batch]
    if len(hits) == 1:
        return hits[0] == 1
    if dims.count(1) == 1:  # exported for one token: the other axis is the batch
        return dims[0] == 1
    raise BundleError(f"{file}: cannot tell which axis of input {ids} {dims} is the batch: "
                      "give --layout batch-first (ids (batch, seq)) or --layout time-major "
                      "((seq, batch), nn.LSTM's default)")


def _lm_names(model: Any, file: str, flag: str, inputs: str | None, outputs: str | None,
              n_state: int | None, layout: str) -> LMGraphNames:
    """The user graph's tensors in the contract's roles: ids[, lengths], states -> logits,
    new states (n_state None: the step, whose state inputs set the count)."""
    actual = [v.name for v in user_inputs(model)]
    by_name = {v.name: v for v in user_inputs(model)}
    what = "prefill" if n_state is not None else "step"
    ins = _names(inputs, actual, tuple(range(1, len(actual) + 1)) or (1,),
                 f"{flag}-input-names", ["ids", "lengths?", "state..."], file)
    unfed = [a for a in actual if a not in ins]
    if unfed:
        raise UserError(f"{file}: the {what} graph's inputs {unfed} are not named in "
                        f"--{flag}-input-names {','.join(ins)} (name every input: ids[, "
                        "lengths], state...)")
    lengths = ins[1] if len(ins) > 1 and _is_lengths(by_name[ins[1]]) else None
    states = ins[2:] if lengths else ins[1:]
    if n_state is None and not states:
        raise BundleError(f"{file}: step inputs {ins}: expected the token ids then the state "
                          "tensor(s) the model carries from token to token (an LSTM's h and "
                          "c are two)")
    if n_state is not None and len(states) not in (0, n_state):
        raise BundleError(f"{file}: prefill state inputs {states}: expected none (zeros) or "
                          f"the step's {n_state} state tensor(s), in the step's order")
    if by_name[ins[0]].type.tensor_type.elem_type not in _INT_TYPES:
        raise BundleError(f"{file}: {what} input {ins[0]} is not integer token ids (name the "
                          f"inputs in order with --{flag}-input-names)")
    count = n_state if n_state is not None else len(states)
    outs = _names(outputs, [o.name for o in model.graph.output], (1 + count,),
                  f"{flag}-output-names", ["logits", *["new state"] * count], file)
    tm = _time_major(model, ins[0], states + outs[1:], layout, file)
    return LMGraphNames(ins[0], lengths, states, outs[0], outs[1:], tm)


def pack_lm_files(*, repo: PathLike, name: str, prefill: PathLike | None,
                  step: PathLike | None, tokenizer: PathLike | None,
                  prefill_input_names: str | None = None,
                  prefill_output_names: str | None = None,
                  step_input_names: str | None = None, step_output_names: str | None = None,
                  layout: str = "auto", version: int | None = None,
                  specials: dict[str, Any] | None = None, max_tokens: int = 128,
                  progress: bool = True, chat_template: str | None = None) -> Path:
    """`seqserve pack lm`: the user's prefill graph (ids[, lengths][, initial state...]) ->
    (logits, state...) and step graph (ids, state...) -> (logits, new state...) (the same
    file twice for a tutorial-style forward(input, hidden)) composed into the contract's
    `prefill` and `lm_step` (`onnx_compose.compose_prefill / compose_lm_step`).
    `chat_template`: a file or the Jinja itself (`chat_template.read_template`)."""
    if tokenizer is None:
        raise UserError("--tokenizer is required (tokenizer.json or a SentencePiece .model)")
    if layout not in LAYOUTS:
        raise UserError(f"--layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if chat_template is not None:
        chat_template = read_template(chat_template)
    pre_model, step_model = _load(prefill, "--prefill"), _load(step, "--step")
    step_names = _lm_names(step_model, str(step), "step", step_input_names, step_output_names,
                           None, layout)
    by_name = {v.name: v for v in user_inputs(step_model)}
    layouts = value_layouts([by_name[n] for n in step_names.states], str(step), rows="rows")
    pre_names = _lm_names(pre_model, str(prefill), "prefill", prefill_input_names,
                          prefill_output_names, len(layouts), layout)
    check_lm_layouts(step_model, step_names.new_states, layouts, str(step), "step output",
                     True)
    check_lm_layouts(pre_model, pre_names.states, layouts, str(prefill), "prefill input",
                     False)
    check_lm_layouts(pre_model, pre_names.new_states, layouts, str(prefill), "prefill output",
                     True)
    takes = ["initial_state"] if pre_names.states else []  # its own initial states
    graphs = {"prefill": PackedGraph(["state", "log_probs"],
                                     compose_prefill(pre_model, pre_names, layouts,
                                                     str(prefill)), inputs_given=takes),
              "lm_step": PackedGraph(["new_state", "log_probs"],
                                     compose_lm_step(step_model, step_names, layouts,
                                                     str(step)))}
    source = {"packed_by": "seqserve pack", "task": "lm", "prefill": str(prefill),
              "step": str(step), "state": [x.to_dict() for x in layouts],
              "prefill_names": _names_dict(pre_names), "step_names": _names_dict(step_names),
              "sequence_lens": pre_names.lengths is None}
    return pack_bundle("lm", graphs, tokenizer, repo, name, version=version, specials=specials,
                       max_tokens=max_tokens, progress=progress, source=source,
                       state_dim=sum(x.width for x in layouts) if takes else None,
                       chat_template=chat_template)


def _names_dict(names: LMGraphNames) -> dict[str, Any]:
    return {"ids": names.ids, "lengths": names.lengths, "states": names.states,
            "logits": names.logits, "new_states": names.new_states,
            "time_major": names.time_major}
