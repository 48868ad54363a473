"""`seqserve pack TASK`: a model exported outside seqserve -> a verified, versioned bundle."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

NAME = "pack"
HELP = ("Pack a model you exported yourself (ONNX, optional TorchScript twin, a tokenizer.json "
        "or SentencePiece .model) as a verified bundle that `seqserve serve` serves.")
EPILOG = """\
examples:
  seqserve pack classifier --onnx model.onnx --tokenizer tokenizer.json --labels en,fr,de \\
      --repo model_repository --name names
  seqserve pack tagger --onnx tagger.onnx --tokenizer tokenizer.json --labels labels.txt \\
      --repo model_repository --name pos [--crf crf.json]
  seqserve pack translator --encoder enc.onnx --decoder-step step.onnx \\
      --source-tokenizer src.json --target-tokenizer tgt.json --repo model_repository --name mt
  seqserve pack lm --prefill lm.onnx --step lm.onnx --tokenizer chars.json \\
      --prefill-input-names input_ids,h0,c0 --prefill-output-names logits,hn,cn --name chars
  seqserve pack sequence-tagger --onnx forecaster.onnx --features 3 --outputs 1 \\
      --input-names x,n,h0 --output-names y,hn --normalization stats.json --name load
  seqserve pack sequence-classifier --onnx sensor.onnx --features 6 --labels ok,fault \\
      --name faults

The graphs' contract (inputs, outputs, padding rules) is docs/bundle-format.md. pack checks
the signature, parity with the TorchScript twin when given and batch invariance on random
padded batches, and refuses (naming what to change) a model that fails; nothing is written
then. Versions are never overwritten. Worked examples: examples/ and docs/own-model/
(a page per task).
"""


SPECIALS = ("pad", "unk", "bos", "eos")


def _specials(p: argparse.ArgumentParser, prefix: str = "", whose: str = "the tokenizer"
              ) -> None:
    for name in SPECIALS:
        p.add_argument(f"--{prefix}{name}-token", default=None, metavar="TOKEN|ID",
                       help=f"{whose}'s {name} token, a token or an id (default: read from its "
                       "special tokens by name)")


def _files(p: argparse.ArgumentParser, *rows: tuple[str, bool, str]) -> None:
    """File arguments, one (flag, required, help) row each."""
    for flag, required, text in rows:
        p.add_argument(flag, type=Path, required=required, default=None, help=text)


def _target(p: argparse.ArgumentParser) -> None:
    """Where the bundle goes: --repo, --name, --version."""
    p.add_argument("--repo", type=Path, default=Path("model_repository"),
                   help="model repository folder (default: model_repository)")
    p.add_argument("--name", required=True, help="model name (folder under --repo)")
    p.add_argument("--version", type=int, default=None,
                   help="version number (default: the next free integer; never overwrites)")


def _common(p: argparse.ArgumentParser, whose: str = "the tokenizer") -> None:
    _target(p)
    p.add_argument("--max-tokens", type=int, default=128,
                   help="longest input in tokens the bundle accepts (default: 128; the "
                   "batch-invariance check runs up to it)")
    _specials(p, "", whose)


def _rows(p: argparse.ArgumentParser, task: str) -> None:
    _files(p, ("--onnx", True, "the ONNX graph (either PyTorch exporter; *.onnx.data external "
                               "weights beside it are read in)"),
           ("--torchscript", False, "optional TorchScript twin of the same model (same "
                                    "inputs; enables --runtime torchscript and a parity "
                                    "check)"),
           ("--tokenizer", True, "tokenizer.json (Hugging Face tokenizers) or a "
                                 "SentencePiece .model"))
    p.add_argument("--labels", required=True,
                   help="label file (one label per line, in logit order) or a,b,c")
    p.add_argument("--input-names", default=None, metavar="IDS,LENGTHS",
                   help="the graph's own names of its token-id (batch, seq) int64 and length "
                   "(batch,) int64 inputs, in that order (default: its two inputs in order)")
    outs = "LOGITS[,ATTENTION]" if task == "classifier" else "LOGITS"
    p.add_argument("--output-names", default=None, metavar=outs,
                   help=("the graph's own names of its logits (batch, classes) and optional "
                         "attention (batch, seq) outputs" if task == "classifier" else
                         "the graph's own name of its per-token logits or log-probs "
                         "(batch, seq, labels)") + " (default: its outputs in order; recorded "
                   "in the manifest, the file keeps its names)")
    if task == "tagger":
        p.add_argument("--words", choices=["whitespace", "tokenizer"], default="whitespace",
                       help="the unit that gets one label: whitespace words (default: "
                       "\"Hello,\" is one word) or the tokenizer.json's own pre-tokenized "
                       "words (a BERT pre-tokenizer makes \"Hello\" and \",\" two); a word's "
                       "label is read at its first token")
        p.add_argument("--crf", type=Path, default=None, metavar="FILE",
                       help="the tagger's CRF scores: JSON {\"transitions\": [[...]] "
                       "(previous tag, next tag), \"start\": [...], \"end\": [...]} or a "
                       ".npy of (tags + 2, tags) rows (transitions, start, end). The graph's "
                       "output is then the emission scores, kept as they are; the server "
                       "decodes with Viterbi")
    _common(p)


def _series(p: argparse.ArgumentParser, task: str) -> None:
    _files(p, ("--onnx", True, "the ONNX graph (features, lengths[, state tensors...]) -> "
                               "(outputs[, new state tensors...])"),
           ("--torchscript", False, "optional TorchScript twin of the same model (same "
                                    "inputs)"))
    p.add_argument("--features", type=int, required=True,
                   help="the width of one time step's feature vector")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--labels", default=None,
                      help="a classifying model: label file (one per line, in output order) "
                      "or a,b,c")
    what.add_argument("--outputs", type=int, default=None,
                      help="a regression: how many numbers per " +
                      ("step" if task == "sequence-tagger" else "series"))
    p.add_argument("--normalization", default=None, metavar="FILE.json",
                   help='{"mean": [...], "std": [...]} per input feature: the server feeds '
                   "the graph (x - mean) / std, clients send raw values")
    p.add_argument("--output-scale", default=None, metavar="FILE.json",
                   help='{"mean": [...], "std": [...]} per output: the server answers '
                   "outputs * std + mean (regressions trained on normalised targets)")
    p.add_argument("--input-names", default=None, metavar="FEATURES,LENGTHS[,STATE...]",
                   help="the graph's own names of its features (batch, time, dim) float, "
                   "lengths (batch,) int64 and optional state inputs ((layers, batch, hidden) "
                   "or (batch, hidden); an LSTM's h and c are two), in that order (default: "
                   "its inputs in order)")
    p.add_argument("--output-names", default=None, metavar="OUTPUTS[,NEW_STATE...]",
                   help="the graph's own names of its outputs and, with state inputs, its new "
                   "state tensors in the same order (default: its outputs in order)")
    _target(p)
    p.add_argument("--max-steps", type=int, default=128,
                   help="longest series in steps the bundle accepts (default: 128)")


def _translator(p: argparse.ArgumentParser, task: str) -> None:
    _files(p, ("--encoder", True, "the encoder's ONNX graph"),
           ("--decoder-step", True, "the decoder step's ONNX graph (state tensors (layers, "
                                    "rows, hidden) or (rows, hidden))"),
           ("--encoder-torchscript", False, "optional TorchScript twin of the encoder"),
           ("--decoder-step-torchscript", False, "optional TorchScript twin of the decoder "
                                                 "step"),
           ("--tokenizer", False, "one joint tokenizer for source and target"),
           ("--source-tokenizer", False, "the source side's tokenizer (with "
                                         "--target-tokenizer)"),
           ("--target-tokenizer", False, "the target side's tokenizer: decoder ids, bos and "
                                         "eos"))
    p.add_argument("--max-decode-length", type=int, default=128,
                   help="most tokens generated per text (default: 128)")
    _common(p, "the source (or joint) tokenizer")
    _specials(p, "target-", "the --target-tokenizer")


def _lm(p: argparse.ArgumentParser, task: str) -> None:
    _files(p, ("--prefill", True, "the ONNX graph that reads a batch of prompts: token ids "
                                   "(batch, seq) or (seq, batch) -> logits (batch, seq, vocab), "
                                   "(seq, batch, vocab) or (seq*batch, vocab) and the state "
                                   "after the prompt"),
           ("--step", True, "the ONNX graph that advances one token: ids (rows,), (1, rows) or "
                            "(rows, 1) and the state tensors ((layers, rows, hidden) or (rows, "
                            "hidden)) -> logits and the new state tensors (may be the "
                            "--prefill file)"),
           ("--tokenizer", True, "tokenizer.json (Hugging Face tokenizers) or a SentencePiece "
                                 ".model; its vocabulary size must be the model's output size"))
    for graph in ("prefill", "step"):
        p.add_argument(f"--{graph}-input-names", default=None, metavar="IDS[,LENGTHS],STATE...",
                       help=f"the {graph} graph's own input names in the contract's order: "
                       "token ids, an optional lengths (batch,) int input, then the state "
                       "tensors in the step's order (an LSTM's h and c are two; default: its "
                       "inputs in order)")
        p.add_argument(f"--{graph}-output-names", default=None, metavar="LOGITS,STATE...",
                       help=f"the {graph} graph's own output names: logits (or log-probs) "
                       "then the state tensors in the order of the step's state inputs "
                       "(default: its outputs in order)")
    p.add_argument("--layout", choices=["auto", "batch-first", "time-major"], default="auto",
                   help="whether the graphs' 2-D token ids are (batch, seq) or (seq, batch) "
                   "(nn.LSTM's default); auto: the axis they share with the state tensors' "
                   "batch dim")
    p.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                   help="a chat template (Jinja, as Hugging Face tokenizer configs carry "
                   "one): a file (a tokenizer_config.json: its chat_template) or the template "
                   "itself; /v1/chat/completions renders conversations with it (default: "
                   "none, no chat)")
    _common(p, "the tokenizer (bos starts every prompt, eos ends generation)")


SUBCOMMANDS: tuple[tuple[str, str, str, Callable[[argparse.ArgumentParser, str], None]], ...] = (
    ("classifier", "one label per text",
     "Pack a classifier: graph(ids, lengths) -> logits [, attention].", _rows),
    ("tagger", "one label per word",
     "Pack a tagger: graph(ids, lengths) -> per-token logits (log-softmax and zeros past each "
     "row's length are appended).", _rows),
    ("translator", "sequence to sequence (batched beam search)",
     "Pack a translator: an encoder graph(ids, lengths) -> (memory, state...) and a decoder "
     "step graph(prev_ids, state..., memory, mask) -> (logits, new state..., [attention]); "
     "pack appends log-softmax + top-k, gathers memory rows by memory_index and flattens the "
     "state tensors.", _translator),
    ("lm", "language model (streamed generation, scoring)",
     "Pack a language model: a prefill graph(ids[, lengths][, initial state...]) -> (logits, "
     "state...) and a step graph(ids, state...) -> (logits, new state...) (the same file "
     "twice for a forward(input, hidden) exported once with dynamic seq and batch axes); pack "
     "appends log-softmax (logits or log-probs both work), zeros past each row's length, zero "
     "initial states, and flattens the state tensors. A prefill without a lengths input gets "
     "one through its LSTM / GRU / RNN nodes (sequence_lens), so its state is each prompt's "
     "own.", _lm),
    ("sequence-classifier", "one result per series of feature vectors",
     "Pack a many-to-one feature-sequence model: graph(features, lengths[, state...]) -> "
     "outputs (batch, k)[, new state...].", _series),
    ("sequence-tagger", "one result per step of a series of feature vectors",
     "Pack a many-to-many feature-sequence model: graph(features, lengths[, state...]) -> "
     "outputs (batch, time, k)[, new state...] (zeros past each row's length are appended).",
     _series),
)
"""Each task's subcommand: name, one-line help, description, the function adding its
arguments."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    sub = parser.add_subparsers(dest="task", metavar="TASK")
    sub.required = True
    for task, text, description, add in SUBCOMMANDS:
        add(sub.add_parser(task, help=text, description=description), task)




def _given_specials(args: argparse.Namespace, prefix: str = "") -> dict[str, str | None]:
    """{"pad": --pad-token, ...} as given (None: read from the tokenizer by name)."""
    return {n: getattr(args, f"{prefix}{n}_token") for n in SPECIALS}


def run(args: argparse.Namespace) -> int:
    from seqserve.export.pack.files import pack_files, pack_series_files

    if args.task in ("sequence-classifier", "sequence-tagger"):
        pack_series_files(args.task, repo=args.repo, name=args.name, onnx=args.onnx,
                          torchscript=args.torchscript, features=args.features,
                          labels=args.labels, outputs=args.outputs,
                          normalization=args.normalization, output_scale=args.output_scale,
                          input_names=args.input_names, output_names=args.output_names,
                          version=args.version, max_steps=args.max_steps)
        return 0

    specials = _given_specials(args)
    if args.task == "lm":
        from seqserve.export.pack.files import pack_lm_files

        pack_lm_files(repo=args.repo, name=args.name, prefill=args.prefill, step=args.step,
                      tokenizer=args.tokenizer, prefill_input_names=args.prefill_input_names,
                      prefill_output_names=args.prefill_output_names,
                      step_input_names=args.step_input_names,
                      step_output_names=args.step_output_names, layout=args.layout,
                      version=args.version, specials=specials, max_tokens=args.max_tokens,
                      chat_template=args.chat_template)
        return 0
    common = {"repo": args.repo, "name": args.name, "version": args.version,
              "specials": specials, "max_tokens": args.max_tokens}
    if args.task == "translator":
        target = _given_specials(args, "target_")
        pack_files("translator", encoder=args.encoder, decoder_step=args.decoder_step,
                   target_specials=target,
                   encoder_torchscript=args.encoder_torchscript,
                   decoder_step_torchscript=args.decoder_step_torchscript,
                   tokenizer=args.tokenizer, source_tokenizer=args.source_tokenizer,
                   target_tokenizer=args.target_tokenizer,
                   max_decode_length=args.max_decode_length, **common)
    else:
        words = {"words": args.words, "crf": args.crf} if args.task == "tagger" else {}
        pack_files(args.task, onnx=args.onnx, torchscript=args.torchscript,
                   tokenizer=args.tokenizer, labels=args.labels,
                   input_names=args.input_names, output_names=args.output_names, **common,
                   **words)
    return 0
