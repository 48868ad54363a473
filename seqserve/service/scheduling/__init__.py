"""The scheduling layer: model-free batching and decoding over a `Runtime`.

- `batcher`: the dynamic batcher of the classifier, tagger and feature-sequence models (token
  budget, length grouping, deadlines, dropped cancellations); `sessions` their stateful
  sessions.
- `loop`: the one loop driver (schedule -> execute -> update, one `Status`) of every decoding
  scheduler; `lanes`: its work lanes, and the one hand-back from runtime threads to the event
  loop (the batcher's threads use it too).
- `decoding`, `scheduler`, `work`, `group`: the translator's decode loop and its decode
  scheduler (step-level continuous batching); `search`, `beam_state`, `beam_search`,
  `finished`, `sampling`, `arrays`: the vectorised beam search and sampling.
- `lm`, `lm_scheduler`, `generation`: the language models' loop, scheduler, options and
  token streams.
- `models`: the scheduled model of each task; `config`: its `ModelConfig`.
- `base`: what they share (per-row timing, the observer interface, right-padding, the cost
  estimates and admission by expected wait).

This layer imports no web framework, no pydantic and no `Settings` (a checked rule: it runs
in the engine process); its inputs are token ids, plain dataclass configs and a Runtime.
"""
