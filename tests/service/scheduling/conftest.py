"""`kernel`: the beam search's implementations a test runs over (Beams(kernel=...)): the
numpy step, and the compiled one (native/beam/build.sh), skipped where it is not built."""

from __future__ import annotations

import pytest

from seqserve.service.scheduling import beam_native


@pytest.fixture(params=[
    pytest.param(False, id="numpy"),
    pytest.param(True, id="kernel", marks=pytest.mark.skipif(
        not beam_native.AVAILABLE,
        reason="the beam kernel is not built (native/beam/build.sh)")),
])
def kernel(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)
