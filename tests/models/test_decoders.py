"""The three translator decoders (models/nn/decoders.py): the order of operations pinned by a
hand-written two-step reference per decoder, decode_step stepped over a target equal to the
teacher-forced forward for every decoder x score x cell, scheduled sampling, and the config
checks that pair decoders with scores."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from seqserve.models.config import TranslatorConfig, translator_overrides
from seqserve.models.nn.rnn import length_mask
from seqserve.models.nn.translator import Translator

torch.set_num_threads(1)

VOCAB = 30
LENGTHS = [5, 1, 8, 3]
DECODERS = [("none", "none", False), ("bahdanau", "additive", False),
            ("luong", "additive", False), ("luong", "dot", False), ("luong", "general", False),
            ("luong", "additive", True), ("luong", "dot", True), ("luong", "general", True)]


def _tiny(**overrides: object) -> Translator:
    base: dict[str, object] = {"vocab_size": VOCAB, "embed_size": 8, "hidden_size": 16,
                               "num_layers": 2, "max_length": 12}
    return Translator(TranslatorConfig(**{**base, **overrides})).eval()  # type: ignore[arg-type]


def _batch() -> tuple[Tensor, Tensor]:
    lengths = torch.tensor(LENGTHS)
    ids = torch.randint(4, VOCAB, (len(LENGTHS), max(LENGTHS)))  # (B, S)
    return ids.masked_fill(~length_mask(lengths, ids.shape[1]), 0), lengths


# ------------------------------------------------------------------ stepping = teacher forcing
@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize(("decoder", "attention", "feeding"), DECODERS)
def test_decode_steps_reproduce_teacher_forcing(decoder: str, attention: str, feeding: bool,
                                                cell: str) -> None:
    """decode_step stepped over the gold prefix gives the teacher-forced log-probs, states
    and attention rows; rows of one request share nothing with other requests."""
    torch.manual_seed(3)
    model = _tiny(cell=cell, decoder=decoder, attention=attention, input_feeding=feeding)
    ids, lengths = _batch()
    tgt_in = torch.randint(4, VOCAB, (4, 5))  # (B, T)
    logits, _ = model(ids, lengths, tgt_in)
    logprobs = torch.log_softmax(logits, -1)  # (B, T, V)
    memory, mask, state = model.encode(ids, lengths)
    assert state.shape == (4, model.config.state_dim)
    _, forced_attn, forced_state = model._decode(tgt_in, state, model._memory(memory, mask))
    for t in range(5):
        state, lp, top, attn = model.decode_step(tgt_in[:, t], state, memory, mask,
                                                 torch.arange(4), VOCAB)
        assert torch.allclose(lp, logprobs[:, t].gather(1, top), atol=1e-5, rtol=0)
        assert torch.allclose(attn, forced_attn[:, t], atol=1e-6, rtol=0)
        assert (attn * (~mask)).abs().sum().item() == 0.0
    assert torch.allclose(state, forced_state, atol=1e-5, rtol=0)
    if decoder == "none":
        assert forced_attn.abs().sum().item() == 0.0
    else:
        assert torch.allclose(forced_attn.sum(-1), torch.ones(4, 5), atol=1e-5)


@pytest.mark.parametrize(("decoder", "attention", "feeding"), DECODERS[:2] + DECODERS[-1:])
def test_scheduled_sampling_runs_the_same_steps(decoder: str, attention: str,
                                                feeding: bool) -> None:
    torch.manual_seed(6)
    model = _tiny(dropout=0.0, decoder=decoder, attention=attention,
                  input_feeding=feeding).train()
    with torch.no_grad():  # a peaked output layer: the model's argmax differs from the gold
        model.output.weight.mul_(8.0)
    ids, lengths = _batch()
    tgt_in, tgt_out = torch.randint(4, VOCAB, (4, 6)), torch.randint(4, VOCAB, (4, 6))
    forced, _ = model(ids, lengths, tgt_in, tgt_out)
    sampled, loss = model(ids, lengths, tgt_in, tgt_out, sampling_prob=1.0)
    assert sampled.shape == forced.shape and loss is not None
    loss.backward()
    assert model.combine.weight.grad is not None
    assert torch.allclose(sampled[:, 0], forced[:, 0], atol=1e-5)  # first input is gold
    assert not torch.allclose(sampled, forced, atol=1e-3)
    gold, _ = model(ids, lengths, tgt_in, tgt_out, sampling_prob=1e-9)  # never samples
    assert torch.allclose(gold, forced, atol=1e-5)


# ------------------------------------------------------------------ hand-written two steps
def _weights(model: Translator) -> dict[str, Tensor]:
    """A 1-layer tanh-RNN translator's parameters under short names (detached)."""
    return {k: v.detach() for k, v in model.named_parameters()}


def _align(w: dict[str, Tensor], query: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
    """Additive score v^T tanh(W_q q + W_k m_j + b) over S rows -> (weights (S,), context)."""
    e = torch.tanh(w["attention.query_proj.weight"] @ query
                   + memory @ w["attention.key_proj.weight"].T + w["attention.key_proj.bias"])
    scores = e @ w["attention.score.weight"][0]  # (S,)
    a = torch.softmax(scores, 0)
    return a, a @ memory


def _rnn(w: dict[str, Tensor], x: Tensor, h: Tensor) -> Tensor:
    return torch.tanh(w["decoder.weight_ih_l0"] @ x + w["decoder.bias_ih_l0"]
                      + w["decoder.weight_hh_l0"] @ h + w["decoder.bias_hh_l0"])


def _out(w: dict[str, Tensor], features: Tensor) -> Tensor:
    o = torch.tanh(w["combine.weight"] @ features + w["combine.bias"])
    return o, torch.log_softmax(w["output.weight"] @ o + w["output.bias"], 0)


def _bahdanau(w: dict[str, Tensor], tokens: list[int], s: Tensor, memory: Tensor,
              feeding: bool) -> list[tuple[Tensor, Tensor, Tensor]]:
    """a_t from s_{t-1}; s_t = RNN([y; c_t], s_{t-1}); o_t = tanh(W [s_t; c_t; y])."""
    steps = []
    for tok in tokens:
        y = w["embedding.weight"][tok]
        a, c = _align(w, s, memory)
        s = _rnn(w, torch.cat([y, c]), s)
        _, logp = _out(w, torch.cat([s, c, y]))
        steps.append((logp, a, s))
    return steps


def _luong(w: dict[str, Tensor], tokens: list[int], h: Tensor, memory: Tensor,
           feeding: bool) -> list[tuple[Tensor, Tensor, Tensor]]:
    """h_t = RNN(y [; o_{t-1}], h_{t-1}); a_t from h_t; o_t = tanh(W [h_t; c_t])."""
    steps, o = [], torch.zeros_like(h)
    for tok in tokens:
        y = w["embedding.weight"][tok]
        h = _rnn(w, torch.cat([y, o]) if feeding else y, h)
        a, c = _align(w, h, memory)
        o, logp = _out(w, torch.cat([h, c]))
        steps.append((logp, a, torch.cat([h, o]) if feeding else h))
    return steps


def _fixed(w: dict[str, Tensor], tokens: list[int], state: Tensor, memory: Tensor,
           feeding: bool) -> list[tuple[Tensor, Tensor, Tensor]]:
    """c fixed; s_t = RNN([y; c], s_{t-1}); o_t = tanh(W [s_t; c; y]); no attention."""
    s, c = state[:2], state[2:]
    steps = []
    for tok in tokens:
        y = w["embedding.weight"][tok]
        s = _rnn(w, torch.cat([y, c]), s)
        _, logp = _out(w, torch.cat([s, c, y]))
        steps.append((logp, torch.zeros(memory.shape[0]), torch.cat([s, c])))
    return steps


Reference = Callable[..., list[tuple[Tensor, Tensor, Tensor]]]
HAND = [("bahdanau", "additive", False, _bahdanau), ("luong", "additive", False, _luong),
        ("luong", "additive", True, _luong), ("none", "none", False, _fixed)]


@pytest.mark.parametrize(("decoder", "attention", "feeding", "reference"), HAND)
def test_two_steps_follow_the_papers_order(decoder: str, attention: str, feeding: bool,
                                           reference: Reference) -> None:
    """H = E = D = 2, a tanh RNN, three memory rows: two decode steps against the equations
    written out by hand (the reference functions above), log-probs, attention and state."""
    torch.manual_seed(11)
    model = _tiny(cell="rnn", num_layers=1, bidirectional=False, hidden_size=2, embed_size=2,
                  dropout=0.0, decoder=decoder, attention=attention, input_feeding=feeding)
    w = _weights(model)
    memory = torch.tensor([[0.5, -1.0], [1.5, 0.25], [-0.75, 2.0]])  # (S, D)
    state = torch.tensor([0.3, -0.6, 0.9, 0.2][: model.config.state_dim])
    if feeding:  # o_0 = 0 is what encode() starts from
        state = torch.cat([state[:2], torch.zeros(2)])
    tokens = [2, 7]
    expected = reference(w, tokens, state[:2] if decoder != "none" else state, memory, feeding)
    rows = state[None]
    for tok, (logp, a, new_state) in zip(tokens, expected, strict=True):
        rows, lp, ids, attn = model.decode_step(torch.tensor([tok]), rows, memory[None],
                                                torch.ones(1, 3, dtype=torch.bool),
                                                torch.zeros(1, dtype=torch.int64), VOCAB)
        assert torch.allclose(lp[0], logp[ids[0]], atol=1e-6)
        assert torch.allclose(attn[0], a, atol=1e-6)
        assert torch.allclose(rows[0], new_state, atol=1e-6)
    if decoder == "bahdanau":  # step 1 aligned from s_0: aligning from s_1 differs
        from_new_state, _ = _align(w, expected[0][2], memory)
        assert not torch.allclose(from_new_state, expected[0][1], atol=1e-3)


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(("overrides", "words"), [
    ({"decoder": "bahdanau", "attention": "dot"}, ["attention='dot'", "decoder='bahdanau'",
                                                   "attention='additive'"]),
    ({"decoder": "none", "attention": "additive"}, ["decoder='none'", "attention='none'"]),
    ({"decoder": "luong", "attention": "none"}, ["attention='none'", "decoder='luong'"]),
    ({"decoder": "bahdanau", "input_feeding": True}, ["input_feeding", "decoder='luong'"]),
    ({"decoder": "x"}, ["decoder='x'"]),
    ({"forget_bias": 50.0}, ["forget_bias"]),
])
def test_bad_decoder_configs_name_the_field_and_the_fix(overrides: dict[str, object],
                                                        words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        TranslatorConfig(vocab_size=50, **overrides)  # type: ignore[arg-type]
    for word in words:
        assert word in str(err.value)


def test_decoder_alone_takes_its_default_score() -> None:
    assert translator_overrides({"decoder": "none"})["attention"] == "none"
    assert translator_overrides({"decoder": "bahdanau"})["attention"] == "additive"
    assert translator_overrides({"decoder": "luong", "attention": "dot"})["attention"] == "dot"
    assert translator_overrides({"cell": "gru"}) == {"cell": "gru"}


LEGACY_KEYS = {  # a 1-layer GRU translator's parameters before the decoder option existed
    "embedding.weight", "bridge_h.weight", "bridge_h.bias", "decoder.weight_ih_l0",
    "decoder.weight_hh_l0", "decoder.bias_ih_l0", "decoder.bias_hh_l0",
    "attention.query_proj.weight", "attention.key_proj.weight", "attention.key_proj.bias",
    "attention.score.weight", "combine.weight", "combine.bias", "output.weight",
    "output.bias"}


def test_a_config_from_before_the_decoder_option_is_todays_luong_translator() -> None:
    """An old config.json (no decoder, input_feeding, forget_bias) loads as luong without
    input feeding, with the old parameter names and shapes and the old computation:
    RNN over the whole target, then attention from its outputs, then tanh(W [h; c])."""
    legacy = TranslatorConfig(vocab_size=VOCAB, embed_size=8, hidden_size=16).to_dict()
    for key in ("decoder", "input_feeding", "forget_bias"):
        legacy.pop(key)
    cfg = TranslatorConfig.from_dict(legacy)
    assert (cfg.decoder, cfg.input_feeding, cfg.state_dim) == ("luong", False, 16)
    torch.manual_seed(2)
    model = Translator(cfg).eval()
    params = dict(model.named_parameters())
    assert {k for k in params if not k.startswith("encoder.")} == LEGACY_KEYS
    assert params["decoder.weight_ih_l0"].shape == (48, 8)
    assert params["combine.weight"].shape == (16, 32)
    ids, lengths = _batch()
    tgt_in = torch.randint(4, VOCAB, (4, 5))
    logits, _ = model(ids, lengths, tgt_in)
    memory, mask, state = model.encode(ids, lengths)
    out, _ = model.decoder(model.embedding(tgt_in), state.reshape(4, 1, 16).transpose(0, 1))
    context, _ = model.attention(out, memory, mask)  # type: ignore[misc]
    old = model.output(torch.tanh(model.combine(torch.cat([out, context], -1))))
    assert torch.allclose(logits, old, atol=1e-6)
