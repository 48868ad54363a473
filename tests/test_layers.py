"""The layer rules of docs/architecture.md, checked on the source (every import statement,
lazy ones included) and in a fresh interpreter (what importing a layer actually loads)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEB = ("fastapi", "starlette", "pydantic", "pydantic_settings", "uvicorn")
"""Web-framework modules: none of them may load in the engine-side layers."""

S = "seqserve.service."
ANYTHING = ("seqserve",)
# layer (a package or module prefix) -> prefixes of first-party modules it may import.
# Every module of the tree belongs to one of these rows (the test below fails on one that does
# not): the bottom first, the composition roots last.
ALLOWED: dict[str, tuple[str, ...]] = {
    "seqserve.models": ("seqserve.models",),
    # the forecaster (issue 21): the series is torch-free data; the model reads only the
    # shared cell loops and configs; its trainer stays inside models
    "seqserve.models.data.co2": ("seqserve.models.errors",),
    "seqserve.models.nn.forecaster": ("seqserve.models.config", "seqserve.models.nn.lm",
                                   "seqserve.models.nn.rnn"),
    "seqserve.models.train.forecast": ("seqserve.models",),
    "seqserve.export": ("seqserve.export", "seqserve.models"),
    "seqserve.loadtest": ("seqserve.loadtest", "seqserve.models.errors", "seqserve.models.data"),
    S + "core": (S + "core", "seqserve.models.errors"),
    S + "runtimes": (S + "runtimes", S + "core", "seqserve.export.manifest",
                     "seqserve.export.contract", "seqserve.models.errors"),
    S + "scheduling": (S + "scheduling", S + "runtimes.base", S + "core",
                       "seqserve.export.manifest", "seqserve.export.contract",
                       "seqserve.export.crf"),
    S + "engine": (S + "engine", S + "scheduling", S + "runtimes", S + "core",
                   "seqserve.export.manifest", "seqserve.export.contract",
                   "seqserve.export.signing"),
    S + "workers": (S + "workers", S + "scheduling", S + "core", "seqserve.export.manifest",
                    "seqserve.models.text.tokenizer", "seqserve.models.text.tokenizer_files",
                    "seqserve.models.text.word_align",
                    # torch-free: a tokenizer in Hugging Face's files, a chat template rendered
                    "seqserve.models.text.hf_files", "seqserve.models.text.chat_template"),
    # the model versions an API process serves and its side of the model control
    S + "repository": (S + "repository", S + "core", S + "engine", S + "workers",
                       "seqserve.export.manifest", "seqserve.models.text.tokenizer_files"),
    S + "web": (S + "web", S + "repository", S + "core", S + "engine", S + "workers",
                S + "scheduling", S + "runtimes.base", "seqserve.export.manifest",
                "seqserve.models.text.tokenizer", "seqserve.models.text.tokenizer_files",
                "seqserve.models.errors"),
    S + "api": (S + "api", S + "web", S + "repository", S + "workers", S + "scheduling.search",
                S + "scheduling.generation", S + "core"),
    S + "server": (S + "server", S + "api", S + "web", S + "repository", S + "engine",
                   S + "workers",
                   S + "scheduling", S + "runtimes", S + "core", "seqserve.export.manifest",
                   "seqserve.export.versions",
                   "seqserve.models.errors"),
    # composition roots: the command line and the package's public API (lazy imports)
    "seqserve.cli": ANYTHING,
    "seqserve.__main__": ANYTHING,
    "seqserve.service": (),
    "seqserve.pack": ANYTHING,
    "seqserve": ANYTHING,
}
FIRST_PARTY = ("seqserve",)
FORBIDDEN_THIRD_PARTY: dict[str, tuple[str, ...]] = {
    "seqserve.models.data.co2": WEB + ("torch",),
    "seqserve.models.nn.forecaster": WEB,
    "seqserve.models.train.forecast": WEB,
    S + "core": WEB + ("torch",),
    S + "runtimes": WEB,
    S + "scheduling": WEB + ("torch",),
    S + "engine": WEB + ("torch",),
    S + "workers": WEB + ("torch",),
    S + "repository": WEB + ("torch",),
    "seqserve.loadtest": ("fastapi", "torch"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Every module named by an import statement in `path` (absolute imports)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


EXACT = ("seqserve", "seqserve.service")
"""Rows that hold one module (a package's __init__), not the modules below it."""


def _layer(module: str) -> str | None:
    matches = [k for k in ALLOWED
               if module == k or (k not in EXACT and module.startswith(k + "."))]
    return max(matches, key=len) if matches else None


def _sources() -> list[Path]:
    return sorted((ROOT / "seqserve").rglob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_imports_only_the_layers_below_it(path: Path) -> None:
    module = _module_name(path)
    layer = _layer(module)
    assert layer is not None, f"{module} belongs to no layer of the table"
    allowed, forbidden = ALLOWED[layer], FORBIDDEN_THIRD_PARTY.get(layer, ())
    for name in _imports(path):
        top = name.split(".")[0]
        if top in FIRST_PARTY:
            assert any(name == a or name.startswith(a + ".") for a in allowed), (
                f"{module} (layer {layer}) imports {name}; allowed: {allowed}")
        assert top not in forbidden, f"{module} (layer {layer}) imports {top}"


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120)
    return set(json.loads(out.stdout))


def test_engine_side_layers_load_no_web_framework_and_no_torch() -> None:
    """What the engine process imports (its own layer, scheduling, runtimes, ONNX Runtime):
    no FastAPI, Starlette, pydantic or uvicorn, and no torch."""
    loaded = _loaded_after_import([
        S + m for m in ("core.errors", "core.metrics", "core.logs", "scheduling",
                        "scheduling.batcher", "scheduling.decoding", "scheduling.search",
                        "scheduling.models", "runtimes", "runtimes.onnx", "engine.server",
                        "engine.loading", "engine.protocol",
                        "engine.client", "engine.__main__")
    ])
    bad = sorted(m for m in loaded if m.split(".")[0] in (*WEB, "torch"))
    assert not bad, bad


def test_workers_load_no_web_framework() -> None:
    loaded = _loaded_after_import(["seqserve.service.workers", "seqserve.service.workers.series"])
    bad = sorted(m for m in loaded if m.split(".")[0] in (*WEB, "torch"))
    assert not bad, bad
