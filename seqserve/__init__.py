"""seqserve: train, export, pack and serve recurrent sequence models.

One import namespace: `seqserve.models` (PyTorch modules, tokenizer, data, training),
`seqserve.export` (run -> bundle), `seqserve.service` (the server) and `seqserve.loadtest`
(the load generator). The public Python API is re-exported here; importing `seqserve` itself
loads nothing heavy (no torch, no web framework).
"""

from __future__ import annotations

__version__ = "0.2.0"

__all__ = ["__version__", "pack"]


def __getattr__(name: str) -> object:
    """`seqserve.pack` on first use (it imports torch only when a function is called)."""
    if name == "pack":
        import importlib

        return importlib.import_module("seqserve.pack")
    raise AttributeError(f"module 'seqserve' has no attribute {name!r}")
