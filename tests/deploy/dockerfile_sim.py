"""Parse the Dockerfile and run what it runs, without a Docker engine.

`parse_dockerfile` reads the instructions (continuations and comments as Docker reads them);
`simulate(...)` executes one target's stages on this machine: container paths map into a
folder (`root/<path>`), COPY copies from a build context, RUN runs through bash with the
stage's ARG and ENV values, and the final stage's ENTRYPOINT + CMD and HEALTHCHECK come back
as argv lists rewritten to that folder. RUN steps that administer the machine itself (users,
apt) are not run here: they are returned as `skipped` so that a test can pin exactly which.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# RUN steps that change the host (users, system packages): never run outside a container.
HOST_ONLY = re.compile(r"\b(groupadd|useradd|apt-get)\b")


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction."""

    cmd: str
    """Upper-case instruction name (FROM, RUN, COPY, ...)."""
    args: str
    """Everything after the name and its `--flags`, continuations joined."""
    flags: dict[str, str]
    """Leading `--name=value` flags (COPY --from, HEALTHCHECK --interval, ...)."""
    line: int
    """1-based line where the instruction starts."""


@dataclass
class Stage:
    """A build stage: `FROM base AS name` and its instructions."""

    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def last(self, cmd: str) -> Instruction | None:
        found = self.all(cmd)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    """Global ARGs (before the first FROM) and stages in file order."""

    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r} in the Dockerfile")

    def resolved_base(self, stage: Stage) -> str:
        """The stage's FROM with global ARGs substituted."""
        return expand(stage.base, self.global_args)

    def image_of(self, name: str) -> str:
        """The external image a stage finally builds on (FROM through named stages)."""
        stage = self.stage(name)
        while stage.base in {s.name for s in self.stages}:
            stage = self.stage(stage.base)
        return self.resolved_base(stage)

    def chain(self, target: str) -> list[Stage]:
        """Every stage `target` needs (FROM a stage, COPY --from), in file order."""
        names = {s.name for s in self.stages}
        needed: set[str] = set()

        def visit(name: str) -> None:
            if name in needed:
                return
            needed.add(name)
            stage = self.stage(name)
            if stage.base in names:
                visit(stage.base)
            for copy in stage.all("COPY"):
                if copy.flags.get("from") in names:
                    visit(copy.flags["from"])

        visit(target)
        return [s for s in self.stages if s.name in needed]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue  # comments vanish, also inside a continuation
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        out.append((start, " ".join(b for b in buf if b)))
        buf = []
    if buf:
        out.append((start, " ".join(buf)))
    return out


def _split_flags(rest: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        token, _, rest = rest.partition(" ")
        name, _, value = token[2:].partition("=")
        flags[name] = value
        rest = rest.lstrip()
    return flags, rest


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions grouped by stage; unnamed stages are named by their index."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, logical in _logical_lines(text):
        cmd, _, rest = logical.partition(" ")
        cmd = cmd.upper()
        flags, rest = _split_flags(rest.strip()) if cmd in {"COPY", "ADD", "RUN", "FROM",
                                                            "HEALTHCHECK"} else ({}, rest)
        if cmd == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name=name, base=parts[0]))
        elif not stages:
            if cmd == "ARG":
                key, _, value = rest.partition("=")
                global_args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append(Instruction(cmd, rest.strip(), flags, line))
    return Dockerfile(global_args, stages)


def expand(text: str, values: dict[str, str]) -> str:
    """`$NAME` and `${NAME}` as Docker expands them in ARG/ENV/COPY/WORKDIR."""

    def sub(m: re.Match[str]) -> str:
        return values.get(m.group(1) or m.group(2), "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT/CMD/HEALTHCHECK CMD (ValueError if shell form)."""
    value = json.loads(args)
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"not an exec-form JSON array: {args}")
    return value


def env_pairs(args: str) -> list[tuple[str, str]]:
    tokens = shlex.split(args)
    if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
        return [(tokens[0], " ".join(tokens[1:]))]
    return [(k, v) for k, _, v in (t.partition("=") for t in tokens)]


def dockerignore_filter(context: Path) -> list[str]:
    ignore = context / ".dockerignore"
    if not ignore.exists():
        return []
    return [ln.strip() for ln in ignore.read_text().splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether `.dockerignore` excludes the context path `rel` (or a folder above it)."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        pat = pattern.rstrip("/")
        for p in prefixes:
            if fnmatch.fnmatch(p, pat):
                return True
            if pat.startswith("**/") and fnmatch.fnmatch(p.split("/")[-1], pat[3:]):
                return True
    return False


@dataclass
class Simulation:
    """What `simulate` did: the final stage's commands rewritten to the host folder."""

    root: Path
    entrypoint: list[str]
    healthcheck: list[str]
    env: dict[str, str]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Simulator:
    """Runs the stages of one target inside `root` (see module doc)."""

    def __init__(self, df: Dockerfile, context: Path, root: Path,
                 build_args: dict[str, str], drop_env: frozenset[str],
                 timeout_s: float) -> None:
        self.df, self.context, self.root = df, context, root
        self.build_args, self.drop_env, self.timeout_s = build_args, drop_env, timeout_s
        self.ignore = dockerignore_filter(context)
        self.top_dirs = self._container_top_dirs()
        self.shim = root / ".shim"
        self.shim.mkdir(parents=True, exist_ok=True)
        python = Path(getattr(sys, "_base_executable", sys.executable))
        for name in ("python", "python3"):
            link = self.shim / name
            if not link.exists():
                link.symlink_to(python)

    def _container_top_dirs(self) -> set[str]:
        """First path components the build creates: they are what gets rewritten."""
        tops: set[str] = set()
        for stage in self.df.stages:
            for ins in stage.instructions:
                paths: list[str] = []
                if ins.cmd in {"COPY", "WORKDIR"}:
                    paths = ins.args.split()[-1:]
                elif ins.cmd == "ENV":
                    paths = [p for _, v in env_pairs(ins.args) for p in v.split(":")]
                elif ins.cmd == "RUN":
                    paths = re.findall(r"-m venv (\S+)", ins.args)
                tops.update(p.split("/")[1] for p in paths if p.startswith("/") and len(p) > 1)
        return tops

    def host(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def rewrite(self, text: str) -> str:
        """Container paths under the build's top folders -> paths under `root`."""
        tops = "|".join(sorted(self.top_dirs))
        return re.sub(rf"(?<![\w./-])/({tops})(?=/|\b|$)", rf"{self.root}/\1", text)

    def run_target(self, target: str) -> Simulation:
        sim = Simulation(self.root, [], [], {})
        for stage in self.df.chain(target):
            env = self._run_stage(stage, sim)
            if stage.name == target:
                sim.env = env
                self._finish(stage, sim)
        return sim

    def _run_stage(self, stage: Stage, sim: Simulation) -> dict[str, str]:
        args = dict(self.df.global_args)
        env: dict[str, str] = {"PATH": f"{self.shim}:{os.environ['PATH']}",
                               "HOME": os.environ.get("HOME", "/root")}
        workdir = "/"
        base = self.df.stages[[s.name for s in self.df.stages].index(stage.base)] \
            if stage.base in {s.name for s in self.df.stages} else None
        if base is not None:
            env.update(self._stage_env(base))
        for ins in stage.instructions:
            if ins.cmd == "ARG":
                key, _, default = ins.args.partition("=")
                args[key] = self.build_args.get(key, expand(default, args) or args.get(key, ""))
            elif ins.cmd == "ENV":
                for k, v in env_pairs(ins.args):
                    env[k] = expand(self.rewrite(v), {**args, **env})
            elif ins.cmd == "WORKDIR":
                workdir = expand(ins.args, {**args, **env})
                self.host(workdir).mkdir(parents=True, exist_ok=True)
            elif ins.cmd == "COPY":
                self._copy(ins, {**args, **env}, workdir)
            elif ins.cmd == "RUN":
                self._run(ins, args, env, workdir, sim)
        return env

    def _stage_env(self, stage: Stage) -> dict[str, str]:
        env: dict[str, str] = {}
        for ins in stage.all("ENV"):
            env.update({k: self.rewrite(v) for k, v in env_pairs(ins.args)})
        return env

    def _copy(self, ins: Instruction, values: dict[str, str], workdir: str) -> None:
        *srcs, dest = expand(ins.args, values).split()
        dest_abs = dest if dest.startswith("/") else f"{workdir.rstrip('/')}/{dest}"
        target = self.host(dest_abs)
        from_stage = ins.flags.get("from")
        for src in srcs:
            source = self.host(src) if from_stage else self.context / src.rstrip("/")
            if from_stage and source == target:
                continue  # same path in the shared folder: already there
            self._copy_tree(source, target, dest.endswith("/") or len(srcs) > 1,
                            None if from_stage else src.rstrip("/"))

    def _copy_tree(self, source: Path, target: Path, into: bool, rel: str | None) -> None:
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            for child in source.iterdir():
                child_rel = None if rel is None else f"{rel}/{child.name}"
                if child_rel is not None and ignored(child_rel.lstrip("./"), self.ignore):
                    continue
                self._copy_tree(child, target / child.name, False, child_rel)
            return
        if not source.exists():
            raise FileNotFoundError(f"COPY source missing from the build context: {source}")
        dest = target / source.name if into else target
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)

    def _run(self, ins: Instruction, args: dict[str, str], env: dict[str, str],
             workdir: str, sim: Simulation) -> None:
        if HOST_ONLY.search(ins.args):
            sim.skipped.append(ins.args)
            return
        run_env = {k: v for k, v in {**args, **env}.items() if k not in self.drop_env}
        command = self.rewrite(ins.args)
        result = subprocess.run(["bash", "-eo", "pipefail", "-c", command], env=run_env,
                                cwd=self.host(workdir), capture_output=True, text=True,
                                timeout=self.timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"Dockerfile line {ins.line} failed ({result.returncode}): "
                               f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        sim.ran.append(ins.args)

    def _finish(self, stage: Stage, sim: Simulation) -> None:
        entry, cmd, health = stage.last("ENTRYPOINT"), stage.last("CMD"), stage.last("HEALTHCHECK")
        if entry is None and cmd is None and health is None:
            return  # a build stage: nothing to start
        if entry is None or cmd is None or health is None:
            raise ValueError(f"stage {stage.name} lacks ENTRYPOINT, CMD or HEALTHCHECK")
        sim.entrypoint = [self.rewrite(a) for a in exec_form(entry.args) + exec_form(cmd.args)]
        kind, _, rest = health.args.partition(" ")
        if kind.upper() != "CMD":
            raise ValueError(f"HEALTHCHECK is not `CMD [...]`: {health.args}")
        sim.healthcheck = exec_form(rest.strip())


def simulate(dockerfile: Path, target: str, context: Path, root: Path,
             build_args: dict[str, str] | None = None,
             drop_env: frozenset[str] = frozenset(), timeout_s: float = 600) -> Simulation:
    """Build `target` of `dockerfile` into `root` (see the module doc)."""
    df = parse_dockerfile(dockerfile.read_text())
    sim = Simulator(df, context, root, build_args or {}, drop_env, timeout_s)
    return sim.run_target(target)
