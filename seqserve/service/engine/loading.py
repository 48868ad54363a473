"""One bundle version -> verified manifest, runtime instances and its started, scheduled model.

The one loader: the engine process loads and verifies every bundle with `build_served` (and
hands the API processes what they need); the single-process server does the same in its own
process. A failure raises (the caller records the version as failed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from seqserve.export.manifest import BundleError, Manifest, load_bundle, read_manifest
from seqserve.export.signing import check_signed, load_trusted
from seqserve.service.engine.options import EngineOptions
from seqserve.service.engine.scan import startup_bundles
from seqserve.service.runtimes import load_runtime
from seqserve.service.runtimes.base import Runtime, RuntimeSpec
from seqserve.service.scheduling.base import Observer
from seqserve.service.scheduling.models import ServedModel, build_model

RuntimeFactory = Callable[[RuntimeSpec, Path, Manifest], Runtime]
"""Builds a bundle's runtime (tests inject fakes); default
`seqserve.service.runtimes.load_runtime`."""


def keeps_sessions(path: Path) -> bool:
    """Whether a bundle version keeps per-session state (a feature-sequence model with a
    `state_dim`): its sessions must live in one process, the engine, when several API
    processes serve. A manifest that cannot be read is not (whoever loads it reports why)."""
    try:
        manifest = read_manifest(path)
    except (BundleError, OSError, ValueError):
        return False
    return not manifest.has_tokenizer and bool(manifest.state_dim)


def engine_bundles(options: EngineOptions) -> list[tuple[str, int, Path]]:
    """The bundle versions an engine process loads: every one, or (hybrid layout) only those
    that keep sessions; the API processes load the others themselves."""
    found = startup_bundles(options.repo, options.model_control, options.load_models)
    if options.bundles == "all":
        return found
    return [b for b in found if keeps_sessions(b[2])]


@functools.cache
def trusted_keys(folder: str) -> dict[str, object]:
    """The trusted public keys of a folder, read once per process."""
    return load_trusted(folder)


def failure_reason(exc: BaseException, path: str | Path) -> str:
    """Why the version at `path` failed, as `/v1/models`, the readiness answer and the log say
    it: the exception's type and message, with the folder above its model's left out (its
    files are named `name/version/file`, relative to the repository, or to the copy the
    supervisor loads it from: answers do not show the server's disk layout)."""
    text = f"{type(exc).__name__}: {exc}"
    above = Path(path).parent.parent
    for prefix in {str(above.resolve()), str(above)}:
        text = text.replace(prefix.rstrip("/") + "/", "")
    return text


def max_tokens_of(manifest: Manifest, limit: int) -> int:
    """The token limit of a bundle's texts (a feature-sequence bundle: its steps per
    series): the server's `max_tokens`, capped by the bundle's own."""
    key = "max_tokens" if manifest.has_tokenizer else "max_steps"
    return min(limit, int(manifest.limits.get(key, limit)))


def build_served(name: str, path: Path, options: EngineOptions,
                 observer: Observer | None = None,
                 runtime_factory: RuntimeFactory | None = None,
                 ) -> tuple[Manifest, ServedModel]:
    """Verify the bundle, open its runtime instances and schedule them (blocking: call it
    from a thread). Start the model with `await model.start()` (warm-up) before it serves."""
    manifest = load_bundle(path, verify=True)
    if options.trusted_keys is not None:
        check_signed(path, trusted_keys(options.trusted_keys))
    factory = runtime_factory or load_runtime
    instances = 1 if manifest.spec.shared_instance else max(1, options.instances)
    runtimes = [factory(options.runtime, path, manifest) for _ in range(instances)]
    config = options.model_config(max_tokens_of(manifest, options.max_tokens))
    return manifest, build_model(name, runtimes, manifest, config, observer, path)
