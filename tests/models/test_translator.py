"""Translator: entry-point shapes, padding/batch invariance, step graph vs teacher forcing,
reference greedy and beam decoding."""

from __future__ import annotations

import pytest
import torch

from seqserve.models.config import TranslatorConfig
from seqserve.models.nn.decoding import beam_search, greedy_decode
from seqserve.models.nn.rnn import length_mask
from seqserve.models.nn.translator import Translator

torch.set_num_threads(1)

LENGTHS = [5, 1, 8, 3]
VOCAB = 30


def _tiny(**overrides: object) -> Translator:
    base: dict[str, object] = {"vocab_size": VOCAB, "embed_size": 8, "hidden_size": 16,
                               "num_layers": 2, "max_length": 12}
    return Translator(TranslatorConfig(**{**base, **overrides})).eval()  # type: ignore[arg-type]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor(LENGTHS)
    ids = torch.randint(4, VOCAB, (len(LENGTHS), max(LENGTHS)))  # (B, S)
    return ids.masked_fill(~length_mask(lengths, ids.shape[1]), 0), lengths


CASES = [(c, a, b) for c in ("rnn", "lstm", "gru") for a in ("additive", "dot", "general")
         for b in (True, False)]


@pytest.mark.parametrize(("cell", "attention", "bidirectional"), CASES)
def test_entry_point_shapes_and_encoder_padding_invariance(cell: str, attention: str,
                                                           bidirectional: bool) -> None:
    torch.manual_seed(0)
    model = _tiny(cell=cell, attention=attention, bidirectional=bidirectional)
    ids, lengths = _batch()
    memory, mask, state = model.encode(ids, lengths)
    dim = model.config.state_dim
    assert memory.shape == (4, 8, 16) and mask.dtype == torch.bool and state.shape == (4, dim)
    assert memory[~mask].abs().sum().item() == 0.0
    for row, n in enumerate(LENGTHS):
        mem1, _, state1 = model.encode(ids[row : row + 1, :n], lengths[row : row + 1])
        assert torch.allclose(mem1[0], memory[row, :n], atol=1e-5, rtol=0)
        assert torch.allclose(state1[0], state[row], atol=1e-5, rtol=0)
    index = torch.tensor([2, 2, 0, 1, 3, 3])
    new_state, lp, top, attn = model.decode_step(torch.full((6,), 2), state[index], memory, mask,
                                                 index, 3)
    assert new_state.shape == (6, dim) and lp.shape == top.shape == (6, 3)
    assert attn.shape == (6, 8) and top.dtype == torch.int64
    assert torch.equal(lp[0], lp[1]) and torch.equal(top[4], top[5])  # same request, same row
    assert (attn * (~mask[index])).abs().sum().item() == 0.0
    logits, loss = model.train()(ids, lengths, torch.randint(4, VOCAB, (4, 6)),
                                 torch.randint(0, VOCAB, (4, 6)))
    assert logits.shape == (4, 6, VOCAB) and loss is not None and loss.ndim == 0


@pytest.mark.parametrize("k", [3, torch.tensor(3), torch.tensor([3])])
def test_decode_step_accepts_int_and_tensor_k(k: int | torch.Tensor) -> None:
    model = _tiny()
    ids, lengths = _batch()
    memory, mask, state = model.encode(ids, lengths)
    _, lp, top, _ = model.decode_step(torch.full((4,), 2), state, memory, mask,
                                      torch.arange(4), k)
    assert lp.shape == (4, 3)
    assert bool((lp[:, :-1] >= lp[:, 1:]).all())  # sorted, best first
    assert bool((lp.exp().sum(-1) <= 1.0 + 1e-6).all())


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_decode_steps_reproduce_teacher_forcing(cell: str) -> None:
    """Stepping decode_step over the gold prefix gives the teacher-forced log-probs."""
    torch.manual_seed(3)
    model = _tiny(cell=cell)
    ids, lengths = _batch()
    tgt_in = torch.randint(4, VOCAB, (4, 5))
    logits, _ = model(ids, lengths, tgt_in)
    logprobs = torch.log_softmax(logits, -1)  # (B, T, V)
    memory, mask, state = model.encode(ids, lengths)
    for t in range(5):
        state, lp, top, _ = model.decode_step(tgt_in[:, t], state, memory, mask,
                                              torch.arange(4), VOCAB)
        expected = logprobs[:, t].gather(1, top)
        assert torch.allclose(lp, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_greedy_and_beam_give_identical_tokens_alone_and_batched(cell: str) -> None:
    torch.manual_seed(4)
    model = _tiny(cell=cell)
    with torch.no_grad():  # a peaked output layer so that decoding emits varied tokens
        model.output.weight.mul_(8.0)
    ids, lengths = _batch()
    greedy = greedy_decode(model, ids, lengths)
    beams = beam_search(model, ids, lengths, beam_size=3, n_best=2)
    assert any(len(tokens) > 1 for tokens in greedy)
    for row, n in enumerate(LENGTHS):
        src, src_len = ids[row : row + 1, :n], lengths[row : row + 1]
        assert greedy_decode(model, src, src_len) == [greedy[row]]
        alone = beam_search(model, src, src_len, beam_size=3, n_best=2)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in beams[row]]
        assert len(greedy[row]) <= min(12, 2 * n + 10)
        scores = [h.score for h in beams[row]]
        assert scores == sorted(scores, reverse=True) and len(scores) >= 1


def test_beam_size_one_equals_greedy() -> None:
    torch.manual_seed(5)
    model = _tiny()
    with torch.no_grad():
        model.output.weight.mul_(8.0)
    ids, lengths = _batch()
    beams = beam_search(model, ids, lengths, beam_size=1, length_penalty=0.0)
    assert [b[0].tokens for b in beams] == greedy_decode(model, ids, lengths)


def test_scheduled_sampling_changes_inputs_but_keeps_shapes() -> None:
    torch.manual_seed(6)
    model = _tiny(dropout=0.0).train()
    ids, lengths = _batch()
    tgt_in, tgt_out = torch.randint(4, VOCAB, (4, 6)), torch.randint(4, VOCAB, (4, 6))
    forced, loss_forced = model(ids, lengths, tgt_in, tgt_out)
    sampled, loss_sampled = model(ids, lengths, tgt_in, tgt_out, sampling_prob=1.0)
    assert sampled.shape == forced.shape and loss_sampled is not None
    assert torch.allclose(sampled[:, 0], forced[:, 0], atol=1e-5)  # first input is always gold
    assert not torch.allclose(sampled, forced, atol=1e-3)


@pytest.mark.parametrize(("field", "value"), [("cell", "x"), ("attention", "x"),
                                              ("hidden_size", 15), ("eos_id", 99)])
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TranslatorConfig(vocab_size=50, **{field: value})  # type: ignore[arg-type]


class _TableModel:
    """A fake step model whose next-token distribution depends only on the step:
    step 0: a .6, eos .25, b .15; step 1: a .6, eos .4; step 2: a ~1; step 3: eos ~1.
    Best sequence: a a a (p ~ .36); short ones end early: [] (.25), [a] (.24)."""

    config = TranslatorConfig(vocab_size=6, hidden_size=2, max_length=12)
    TABLE = [{4: 0.6, 3: 0.25, 5: 0.15}, {4: 0.6, 3: 0.4}, {4: 0.998}, {3: 0.998}]

    def encode(self, src_ids: torch.Tensor, src_lengths: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = src_ids.shape[0]
        return torch.zeros(rows, 1, 1), torch.ones(rows, 1, dtype=torch.bool), torch.zeros(rows, 1)

    def decode_step(self, prev_ids: torch.Tensor, state: torch.Tensor, memory: torch.Tensor,
                    src_mask: torch.Tensor, memory_index: torch.Tensor, k: int | torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = torch.full((len(prev_ids), 6), 1e-4)
        for row, step in enumerate(state[:, 0].long().tolist()):
            for tok, p in self.TABLE[min(step, 3)].items():
                probs[row, tok] = p
        top_lp, top_ids = torch.topk(probs.log(), int(k), dim=-1)
        return state + 1, top_lp, top_ids, torch.ones(len(prev_ids), 1)


def test_beam_search_does_not_stop_on_early_short_hypotheses() -> None:
    model = _TableModel()
    src, lengths = torch.tensor([[5, 5]]), torch.tensor([2])
    assert greedy_decode(model, src, lengths) == [[4, 4, 4]]
    best = beam_search(model, src, lengths, beam_size=2, n_best=2, length_penalty=0.0)[0]
    assert [h.tokens for h in best] == [[4, 4, 4], []]
    assert best[0].logprob == pytest.approx(float(torch.tensor([0.6, 0.6, 0.998, 0.998]).log()
                                                  .sum()), abs=1e-5)
