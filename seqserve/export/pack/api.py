"""`seqserve.pack.classifier / tagger / translator / lm / sequence_classifier /
sequence_tagger`: a user's nn.Module -> verified bundle.

The module is taken as it is (classifier / tagger `forward(ids, lengths)`; a translator's
`encode(ids, lengths)` -> (memory, state...) and `step(prev_ids, state..., memory, mask)` ->
(logits, new state..., [attention]); a language model's `forward(input, hidden)` -> (logits,
hidden), the PyTorch word_language_model's shape); `torch_wrap` adds what the serving
contract needs, ONNX (TorchScript-based exporter, dynamic axes) and TorchScript (trace) are
written from the wrapper, and `pack_bundle` compares both with the eager wrapper on random
padded batches before the bundle appears (a language model: ONNX only, its prefill's
recurrent nodes given the prompts' lengths).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from seqserve.export.contract import SPECS, GraphSpec, expected_spec
from seqserve.export.formats import DEFAULT_OPSET
from seqserve.export.pack.bundle import (
    PackedGraph,
    check_crf_labels,
    pack_bundle,
    pack_series_bundle,
    parse_labels,
    series_labels,
)
from seqserve.export.pack.torch_wrap import (
    ClassifierWrap,
    EncoderWrap,
    LMPrefillRows,
    LMPrefillWrap,
    LMStepWrap,
    SeriesWrap,
    StatefulSeriesWrap,
    StepWrap,
    TaggerWrap,
    example_ids,
    example_series,
    lm_state_tree,
    lm_time_major,
    series_state_tree,
    state_tree,
    step_has_attention,
)
from seqserve.export.writer import say
from seqserve.models.errors import BundleError, UserError
from seqserve.models.text.tokenizer_files import special_ids

PathLike = str | os.PathLike[str]


def _export(module: nn.Module, example: tuple[Tensor, ...], spec: GraphSpec,
            opset: int, trace: bool = True, dynamo: bool = True,
            probes: tuple[tuple[Tensor, ...], ...] = (),
            progress: bool = True) -> tuple[Any, Any]:
    """(onnx.ModelProto, traced ScriptModule) of a wrapper module, its packing calls
    replaced by length-aware equivalents (`packing.export_friendly_packing`). ONNX by
    PyTorch's default exporter (dynamo) when `dynamo`, checked on `probes` (other batch sizes
    and lengths than the example's; `exporters.export_onnx`), else or where that fails by the
    TorchScript-based one, saying so."""
    from seqserve.export.pack.exporters import export_onnx
    from seqserve.export.pack.packing import export_friendly_packing

    module.eval()
    with export_friendly_packing(module) as replaced, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, exporter, note = export_onnx(module, example, spec, opset, dynamo, probes)
        if replaced.packed:
            say(progress, "exported with pack_padded_sequence / pad_packed_sequence replaced "
                "by length-aware equivalents (same results; checked against the eager module "
                "below)")
        if note:
            say(progress, note)
        traced = torch.jit.trace(module, example, check_trace=False) if trace else None
    model.metadata_props.add(key="seqserve.exporter", value=exporter)
    return model, traced


def _probes(example: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], ...]:
    """Inputs of other batch sizes and lengths than `example` (x (B, T, ...), lengths (B,),
    then per-row tensors): (2, 5), (1, 1) and (4, 2T - 3), each with a row of full length."""
    x, lengths, *rest = example
    out = []
    for batch, seq, lens in ((2, 5, [5, 2]), (1, 1, [1]),
                             (4, 2 * x.shape[1] - 3, [2 * x.shape[1] - 3, 2, 9, 1])):
        reps = (-(-batch // x.shape[0]), -(-seq // x.shape[1])) + (1,) * (x.dim() - 2)
        n = torch.tensor(lens, dtype=lengths.dtype)
        out.append((x.repeat(*reps)[:batch, :seq], n,
                    *[t.repeat(-(-batch // t.shape[0]), *[1] * (t.dim() - 1))[:batch]
                      for t in rest]))
    return tuple(out)


def _run_common(task: str, graphs: dict[str, PackedGraph], tokenizer: PathLike,
                repo: PathLike, name: str, source: dict[str, Any] | None = None,
                **kw: Any) -> Path:
    return pack_bundle(task, graphs, tokenizer, repo, name,
                       source={"packed_by": "seqserve.pack", "task": task,
                               "module": kw.pop("module_name"), **(source or {})},
                       opset=kw.pop("opset"), **kw)


def classifier(module: nn.Module, tokenizer: PathLike, labels: Any, repo: PathLike, name: str,
               version: int | None = None, torchscript: bool = True, max_tokens: int = 128,
               specials: dict[str, Any] | None = None, opset: int = DEFAULT_OPSET,
               progress: bool = True) -> Path:
    """Pack a classifier `module(ids (B, T), lengths (B,))` -> logits (B, C) or (logits,
    attention (B, T)) as bundle `repo/name/version` (see module doc)."""
    vocab = special_ids(tokenizer, specials).vocab_size
    ids, lengths = example_ids(vocab)
    module.eval()
    with torch.no_grad():
        out = module(ids, lengths)
    attention = (isinstance(out, tuple | list) and len(out) > 1
                 and tuple(out[1].shape) == tuple(ids.shape))
    wrap = ClassifierWrap(module, attention).eval()
    outputs = ["logits", "attention"] if attention else ["logits"]
    spec = expected_spec("classifier", outputs)
    onnx_model, traced = _export(wrap, (ids, lengths), spec, opset,
                                 probes=_probes((ids, lengths)), progress=progress)
    graph = PackedGraph(outputs, onnx_model, traced if torchscript else None, eager=wrap)
    return _run_common("classifier", {"classifier": graph}, tokenizer, repo, name,
                       version=version, labels=parse_labels(labels), specials=specials,
                       max_tokens=max_tokens, progress=progress, opset=opset,
                       module_name=type(module).__name__)


def tagger(module: nn.Module, tokenizer: PathLike, labels: Any, repo: PathLike, name: str,
           version: int | None = None, torchscript: bool = True, max_tokens: int = 128,
           specials: dict[str, Any] | None = None, opset: int = DEFAULT_OPSET,
           progress: bool = True, words: str = "whitespace",
           emissions: Callable[..., Any] | None = None, crf: Any = None) -> Path:
    """Pack a tagger `module(ids (B, T), lengths (B,))` -> logits (B, T, C) (log-probs work
    too: log-softmax is appended either way). `words`: the unit that gets one label,
    "whitespace" words or the "tokenizer"'s own pre-tokenized words (a tokenizer.json).

    A CRF tagger (`crf_layer`: the PyTorch tutorial's BiLSTM_CRF with its START / STOP
    `transitions`, or a torchcrf-style layer with `start_transitions` / `end_transitions`)
    is found in the module's parameters (`crf=`: scores given instead, a mapping, a .json
    or .npy file, or a module holding them; False: leave the CRF out): its emission scores
    are exported as the graph (from `emissions=`, a callable (ids, lengths) -> (B, T, tags),
    or the module's forward; the tutorial's one-sentence `_get_lstm_features` is batched by
    pack), its scores kept in the bundle and the server decodes with Viterbi, checked here
    against the module's own decoding. `labels` then name the CRF's tags (the tutorial's
    without START and STOP, in index order)."""
    from seqserve.export.pack.crf_layer import tagger_parts

    vocab = special_ids(tokenizer, specials).vocab_size
    ids, lengths = example_ids(vocab)
    module.eval()
    source, found, checked = tagger_parts(module, crf, emissions, ids, lengths)
    names = parse_labels(labels)
    extra: dict[str, Any] = {}
    if found is not None:
        check_crf_labels(found.crf, names)
        say(progress, f"CRF over {found.crf.labels} tags read from {found.where}"
            + (f"; the module's own decoding agrees on {checked} example sentences"
               if checked else "; the module has no decoding pack knows to compare with"))
        extra = {"crf": found.where, "crf_checked_sentences": checked}
    wrap = TaggerWrap(source, normalize=found is None).eval()
    onnx_model, traced = _export(wrap, (ids, lengths), SPECS["tagger"], opset,
                                 probes=_probes((ids, lengths)), progress=progress)
    graph = PackedGraph(["log_probs"], onnx_model, traced if torchscript else None, eager=wrap)
    return _run_common("tagger", {"tagger": graph}, tokenizer, repo, name, version=version,
                       labels=names, specials=specials, max_tokens=max_tokens,
                       progress=progress, opset=opset, module_name=type(module).__name__,
                       words=words, crf=None if found is None else found.crf, source=extra)


def translator(module: nn.Module | None = None, *, encoder: Callable[..., Any] | None = None,
               step: Callable[..., Any] | None = None, tokenizer: PathLike | None = None,
               source_tokenizer: PathLike | None = None,
               target_tokenizer: PathLike | None = None, repo: PathLike = "model_repository",
               name: str = "", version: int | None = None, torchscript: bool = True,
               max_tokens: int = 128, max_decode_length: int = 128,
               specials: dict[str, Any] | None = None,
               target_specials: dict[str, Any] | None = None, opset: int = DEFAULT_OPSET,
               progress: bool = True) -> Path:
    """Pack a translator: `module` with `encode` and `step` methods, or `encoder=` and
    `step=` (modules or methods). `tokenizer` is joint; or give `source_tokenizer` and
    `target_tokenizer` (`specials` then name the source side's special tokens and
    `target_specials` the target side's: {"bos": "<s>", "eos": 3}). LSTM (h, c) states and
    multi-layer states are flattened for the served contract and rebuilt for `step`."""
    if module is not None:
        encoder = encoder or getattr(module, "encode", None)
        step = step or getattr(module, "step", None)
    if encoder is None or step is None:
        raise UserError("give module= with encode() and step() methods, or encoder= and step=")
    parts: list[nn.Module] = []
    for f in (encoder, step):
        bound = f if isinstance(f, nn.Module) else getattr(f, "__self__", None)
        if isinstance(bound, nn.Module) and all(bound is not q for q in parts):
            parts.append(bound)
    owner: nn.Module = module if module is not None else nn.ModuleList(parts)
    owner.eval()
    source = source_tokenizer or tokenizer
    target = target_tokenizer if source_tokenizer is not None else None
    if source is None:
        raise UserError("give tokenizer= (joint) or source_tokenizer= and target_tokenizer=")
    src_vocab = special_ids(source, specials).vocab_size
    if target is None and target_specials:
        raise UserError("target_specials names the special tokens of target_tokenizer; with "
                        "one joint tokenizer= give specials=")
    tgt_vocab = (special_ids(target, target_specials) if target is not None
                 else special_ids(source, specials)).vocab_size
    ids, lengths = example_ids(src_vocab, batch=3, seq=11)
    tree = state_tree(encoder, (ids, lengths))
    enc = EncoderWrap(encoder, tree, owner).eval()
    with torch.no_grad():
        memory, mask, state = enc(ids, lengths)
    index = torch.tensor([0, 0, 1, 2, 2], dtype=torch.int64)
    prev = torch.randint(min(1, tgt_vocab - 1), tgt_vocab, (5,),
                         generator=torch.Generator().manual_seed(1))
    items = tree.build(tree.unflatten(state[index]))
    attention = step_has_attention(step, tree, (prev, *items, memory[index], mask[index]))
    dec = StepWrap(step, tree, attention, owner).eval()
    step_example = (prev, state[index], memory, mask, index, torch.tensor([4]))
    graphs = {}
    for graph, wrap, example in (("encoder", enc, (ids, lengths)),
                                 ("decoder_step", dec, step_example)):
        spec = expected_spec(graph, ())  # no projected keys: a user's step projects its own
        onnx_model, traced = _export(wrap, example, spec, opset, progress=progress,
                                     probes=_probes(example) if graph == "encoder" else ())
        graphs[graph] = PackedGraph([t.name for t in spec.outputs], onnx_model,
                                    traced if torchscript else None, eager=wrap)
    return pack_bundle(
        "translator", graphs, source, repo, name, version=version, target_tokenizer=target,
        specials=specials, target_specials=target_specials, max_tokens=max_tokens,
        max_decode_length=max_decode_length, progress=progress, opset=opset,
        source={"packed_by": "seqserve.pack", "task": "translator",
                "module": type(module if module is not None else owner).__name__,
                "state": [lay.to_dict() for lay in tree.layouts],
                "step_attention": attention}, attention=attention)


def lm(module: nn.Module, *, tokenizer: PathLike, repo: PathLike = "model_repository",
       name: str = "", version: int | None = None, max_tokens: int = 128,
       specials: dict[str, Any] | None = None, batch_first: bool | None = None,
       opset: int = DEFAULT_OPSET, progress: bool = True,
       chat_template: str | None = None) -> Path:
    """Pack a language model `module(input, hidden)` -> (logits or log-probs, new hidden)
    (the PyTorch word_language_model's RNNModel: input (seq, batch), logits (seq, batch, V)
    or flattened (seq*batch, V), hidden an LSTM's (h, c) or a GRU's h, each (layers, batch,
    hidden)) as bundle `repo/name/version`, task "lm" (ONNX graphs).

    `prefill` runs the module once over a batch of prompts from a zero state (init_hidden's
    shapes when it has one); its exported nn.LSTM / GRU / RNN nodes read the prompts' lengths
    (ONNX `sequence_lens`), so the state is each prompt's own after its last token. `lm_step`
    runs it on one token per row. Parity reference: the eager module, each prompt run alone.
    `batch_first`: whether `input` is (batch, seq) (default: the layers' batch_first).
    `specials` name bos (read before every prompt) and eos (ends generation): {"bos":
    "<eos>"}. `chat_template`: a file or the Jinja itself, as `pack lm --chat-template`
    takes it (/v1/chat/completions). No TorchScript twin: a length-aware scripted loop is
    not batch-invariant to 1e-5 in fp32 once the model is trained (GEMMs blocked by batch
    size), ONNX Runtime is."""
    from seqserve.export.pack.onnx_compose import with_sequence_lens

    vocab = special_ids(tokenizer, specials).vocab_size
    if chat_template is not None:
        from seqserve.models.text.chat_template import read_template

        chat_template = read_template(chat_template, "chat_template")
    module.eval()
    time_major = lm_time_major(module) if batch_first is None else not batch_first
    ids, lengths = example_ids(vocab, batch=3, seq=11)
    tree = lm_state_tree(module, ids, time_major)
    prefill = LMPrefillWrap(module, tree, time_major).eval()
    rows = LMPrefillRows(module, tree, time_major).eval()
    step = LMStepWrap(module, tree, time_major).eval()
    with torch.no_grad():
        try:
            state, log_probs = rows(ids, lengths)
        except Exception as exc:  # the module's own error on a contract-shaped batch
            raise BundleError(f"module(input {tuple(_input_shape(ids, time_major))}, hidden) "
                              f"failed: {type(exc).__name__}: {exc}") from exc
    if log_probs.shape[-1] != vocab:
        raise UserError(f"the module gives {log_probs.shape[-1]} logits per token but the "
                        f"tokenizer has {vocab} tokens: the output layer must have one row "
                        "per tokenizer id")
    index = torch.tensor([0, 0, 1, 2, 2], dtype=torch.int64)
    prev = torch.randint(min(1, vocab - 1), vocab, (5,),
                         generator=torch.Generator().manual_seed(1))
    # the TorchScript-based exporter: `with_sequence_lens` feeds the lengths to its native
    # recurrent nodes
    pre_onnx, _ = _export(prefill, (ids, lengths), SPECS["prefill"], opset, trace=False,
                          dynamo=False, progress=progress)
    step_onnx, _ = _export(step, (prev, state[index]), SPECS["lm_step"], opset, trace=False,
                           dynamo=False, progress=progress)
    graphs = {"prefill": PackedGraph(["state", "log_probs"],
                                     with_sequence_lens(pre_onnx, "lengths", "prefill"),
                                     eager=rows),
              "lm_step": PackedGraph(["new_state", "log_probs"], step_onnx, eager=step)}
    return pack_bundle(
        "lm", graphs, tokenizer, repo, name, version=version, specials=specials,
        max_tokens=max_tokens, progress=progress, opset=opset,
        source={"packed_by": "seqserve.pack", "task": "lm", "module": type(module).__name__,
                "state": [lay.to_dict() for lay in tree.layouts], "time_major": time_major,
                "sequence_lens": True}, chat_template=chat_template)


def _input_shape(ids: Tensor, time_major: bool) -> tuple[int, ...]:
    return tuple(ids.shape[::-1]) if time_major else tuple(ids.shape)


def _positional(module: nn.Module) -> int:
    """How many positional arguments `module.forward` takes (every one, defaults included)."""
    import inspect

    params = inspect.signature(module.forward).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return -1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _series(task: str, module: nn.Module, features: int, outputs: int | None,
            labels: Any, normalization: Any, output_scale: Any, repo: PathLike, name: str,
            version: int | None, torchscript: bool, max_steps: int, stateful: bool | None,
            opset: int, progress: bool, grid: dict[str, Any] | None,
            source_run: dict[str, Any] | None = None) -> Path:
    if not isinstance(features, int) or isinstance(features, bool) or features < 1:
        raise UserError(f"features={features!r}: the width of one step's feature vector, an "
                        "integer >= 1")
    names = series_labels(labels, outputs, flags=False)
    module.eval()
    tagger = task == "sequence-tagger"
    x, lengths = example_series(features)
    count = _positional(module)
    if stateful is None:
        stateful = count > 2
    wrap: nn.Module
    if stateful:
        if count == -1:
            count = 1
        tree = series_state_tree(module, (x, lengths), count - 2 if count > 2 else 1)
        wrap = StatefulSeriesWrap(module, tagger, tree).eval()
        state_dim = sum(lay.width for lay in tree.layouts)
        example: tuple[Tensor, ...] = (x, lengths, torch.zeros(x.shape[0], state_dim))
        contract = ["outputs", "new_state"]
    else:
        wrap = SeriesWrap(module, tagger).eval()
        state_dim = 0
        example = (x, lengths)
        contract = ["outputs"]
    with torch.no_grad():
        try:
            out = wrap(*example)[0]
        except Exception as exc:  # the module's own error on a contract-shaped batch
            raise BundleError(f"module(features (3, 11, {features}), lengths (3,)"
                              f"{', state...' if stateful else ''}) failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    want = 3 if tagger else 2
    if out.dim() != want or out.shape[0] != x.shape[0] or (tagger and out.shape[1] != x.shape[1]):
        shape = "(batch, time, k)" if tagger else "(batch, k)"
        raise BundleError(f"a {task} returns outputs {shape}; the module returned "
                          f"{tuple(out.shape)} for features {tuple(x.shape)}")
    k = int(out.shape[-1])
    spec = expected_spec(task.replace("-", "_"), contract)
    onnx_model, traced = _export(wrap, example, spec, opset, probes=_probes(example),
                                 progress=progress)
    graph = PackedGraph(contract, onnx_model, traced if torchscript else None, eager=wrap)
    source: dict[str, Any] = {"packed_by": "seqserve.pack", "task": task,
                              "module": type(module).__name__}
    if stateful:
        source["state"] = [lay.to_dict() for lay in tree.layouts]
    return pack_series_bundle(task, graph, repo, name, features=features,
                              outputs=outputs if outputs is not None else k, labels=names,
                              normalization=normalization, output_scale=output_scale,
                              state_dim=state_dim or None, version=version,
                              max_steps=max_steps, source=source, opset=opset,
                              progress=progress, grid=grid, source_run=source_run)


def sequence_classifier(module: nn.Module, *, features: int, outputs: int | None = None,
                        labels: Any = None, normalization: Any = None,
                        output_scale: Any = None, repo: PathLike = "model_repository",
                        name: str = "", version: int | None = None, torchscript: bool = True,
                        max_steps: int = 128, stateful: bool | None = None,
                        opset: int = DEFAULT_OPSET, progress: bool = True,
                        grid: dict[str, Any] | None = None,
                        source_run: dict[str, Any] | None = None) -> Path:
    """Pack a many-to-one feature-sequence model as bundle `repo/name/version`.

    `module(features (B, T, D) float32, lengths (B,) int64)` -> outputs (B, k); a stateful
    one `module(features, lengths, state...)` -> (outputs, new state...) (auto-detected: a
    forward with more than two positional arguments; `stateful=` overrides), its state
    tensors (layers, B, hidden) or (B, width), an LSTM's (h, c) as a tuple or two arguments,
    flattened into the contract's one `state` (B, state_dim) layer by layer, h before c.
    `labels` (names of the k outputs: a classifier, served with label and probabilities) or
    `outputs` (k: a regression). `normalization` {"mean", "std"} per input feature (or a JSON
    file): the server applies it, clients send raw values. `output_scale` {"mean", "std"} per
    output: the server de-normalises regression outputs. `max_steps`: the longest series.
    `source_run`: the training run the manifest names ({"path", "config", "test_metrics"}, as
    `seqserve export` writes it; optional)."""
    return _series("sequence-classifier", module, features, outputs, labels, normalization,
                   output_scale, repo, name, version, torchscript, max_steps, stateful, opset,
                   progress, grid, source_run)


def sequence_tagger(module: nn.Module, *, features: int, outputs: int | None = None,
                    labels: Any = None, normalization: Any = None, output_scale: Any = None,
                    repo: PathLike = "model_repository", name: str = "",
                    version: int | None = None, torchscript: bool = True, max_steps: int = 128,
                    stateful: bool | None = None, opset: int = DEFAULT_OPSET,
                    progress: bool = True, grid: dict[str, Any] | None = None,
                    source_run: dict[str, Any] | None = None) -> Path:
    """Pack a many-to-many (synced) feature-sequence model: `module(features, lengths[,
    state...])` -> outputs (B, T, k) per step (zeroed past each row's length by the wrapper)
    [, new state...]; the rest as `sequence_classifier`."""
    return _series("sequence-tagger", module, features, outputs, labels, normalization,
                   output_scale, repo, name, version, torchscript, max_steps, stateful, opset,
                   progress, grid, source_run)
