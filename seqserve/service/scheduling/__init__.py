"""The scheduling layer: model-free batching and decoding over a `Runtime`.

- `batcher`: the dynamic batcher of the classifier and tagger (token budget, length grouping,
  deadlines, dropped cancellations).
- `decoding`: the translator's decode scheduler (step-level continuous batching).
- `beam`: per-request beam search and sampling state.
- `base`: what they share (per-row timing, the observer interface, right-padding).

This layer imports no web framework, no pydantic and no `Settings` (a checked rule: it runs
in the engine process); its inputs are token ids, plain dataclass configs and a Runtime.
"""
