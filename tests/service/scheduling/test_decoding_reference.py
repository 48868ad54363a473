"""The reference search itself (tests/service/reference_search.py) behaves as documented."""

from __future__ import annotations

import numpy as np
from fake_translator import FakeTranslator
from reference_search import reference_beam_search


def test_reference_with_beam_one_is_plain_greedy() -> None:
    """The reference itself: beam 1, no penalties = arg-max decoding until EOS."""
    fake = FakeTranslator()
    for src in ([5, 6, 7], [9, 4, 11, 12, 13, 8]):
        memory, state = fake.encode_one(src)
        tokens: list[int] = []
        prev = fake.limits.bos_id
        for _ in range(30):
            logp, _, state = fake.step_one(prev, state, memory)
            prev = int(np.argmax(logp))
            tokens.append(prev)
            if prev == fake.limits.eos_id:
                break
        memory, state = fake.encode_one(src)
        ref = reference_beam_search(fake.step_one, memory, state, bos=2, eos=3, max_len=30,
                                    beam=1, n_best=1)
        assert ref[0].tokens == tokens
