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

# layer (a package or module prefix) -> prefixes of first-party modules it may import
ALLOWED: dict[str, tuple[str, ...]] = {
    "models": ("models",),
    "export": ("export", "models"),
    "loadtest": ("loadtest", "models.errors", "models.data"),
    "service.runtimes": ("service.runtimes", "export.manifest", "models.errors"),
    "service.scheduling": ("service.scheduling", "service.runtimes.base", "service.errors",
                           "export.manifest"),
    "service.engine": ("service.engine", "service.scheduling", "service.runtimes",
                       "service.errors", "service.metrics", "service.logs", "export.manifest"),
    "service.workers": ("service.workers", "service.scheduling", "service.errors",
                        "export.manifest", "models.tokenizer", "models.word_align"),
    "service.api": ("service.api", "service.workers", "service.scheduling.beam",
                    "service.errors", "service.state", "service.repository"),
}
FIRST_PARTY = ("models", "export", "service", "loadtest")
FORBIDDEN_THIRD_PARTY: dict[str, tuple[str, ...]] = {
    "service.runtimes": WEB,
    "service.scheduling": WEB + ("torch",),
    "service.engine": WEB + ("torch",),
    "service.workers": WEB + ("torch",),
    "loadtest": ("fastapi", "torch"),
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


def _layer(module: str) -> str | None:
    matches = [k for k in ALLOWED if module == k or module.startswith(k + ".")]
    return max(matches, key=len) if matches else None


def _sources() -> list[Path]:
    return [p for pkg in FIRST_PARTY for p in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_imports_only_the_layers_below_it(path: Path) -> None:
    module = _module_name(path)
    layer = _layer(module)
    if layer is None:  # service root modules and the CLI (composition root) may import all
        return
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
        "service.scheduling", "service.scheduling.batcher", "service.scheduling.decoding",
        "service.scheduling.beam", "service.scheduling.models", "service.runtimes",
        "service.runtimes.onnx", "service.engine.server", "service.engine.client",
        "service.engine.__main__",
    ])
    bad = sorted(m for m in loaded if m.split(".")[0] in (*WEB, "torch"))
    assert not bad, bad


def test_workers_load_no_web_framework() -> None:
    loaded = _loaded_after_import(["service.workers"])
    bad = sorted(m for m in loaded if m.split(".")[0] in (*WEB, "torch"))
    assert not bad, bad
