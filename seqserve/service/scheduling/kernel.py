"""The scheduling layer's compiled module (`_beam_kernel`: native/beam/beam_kernel.c, built by
native/beam/build.sh, which `make install` and the image's build stage run), loaded once for
its three callers: the beam search's step (beam_native.py), the batcher's plan (plan.py) and
a decode group's memory bank (group.py). Each keeps its Python where the module is not built."""

from __future__ import annotations

import importlib
from typing import Any

_module: Any
try:
    _module = importlib.import_module("seqserve.service.scheduling._beam_kernel")
except ImportError:  # not built: every caller takes its Python
    _module = None


def loaded(*names: str) -> Any:
    """The module where it is built and has every function in `names` (one built from an
    older beam_kernel.c may lack the newer ones), else None."""
    if _module is None or not all(hasattr(_module, n) for n in names):
        return None
    return _module
