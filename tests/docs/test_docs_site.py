"""The documentation site (mkdocs.yml, docs/) and the README that points into it.

- `mkdocs build --strict` succeeds: every page is in the nav, and no link or anchor is broken
  (mkdocs.yml's `validation` makes each of those a warning, strict mode makes a warning fail).
- Every relative link of the README resolves: the file exists, and an anchor into a docs page
  is one of that page's headings.
- The README keeps its two commands, exactly as the Makefile and .ci/run use them, and stays a
  page (under 200 lines), not a manual.
- Each "Serve your own model" page of a task family runs as written: its fenced ```python
  blocks in order, in one namespace, in an empty folder, then its `seqserve pack`, `verify`
  and `inspect` shell lines through the CLI's own `main` (shell lines that start a server or
  send requests are not run). A page that prints or asserts something checks it as it runs.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OWN_MODEL_PAGES = ["classifier", "tagger", "translator", "lm", "series"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _heading_ids(page: Path) -> set[str]:
    """The anchors mkdocs gives a page's headings (Python-Markdown's toc, as mkdocs.yml)."""
    import markdown

    html = markdown.markdown(page.read_text(encoding="utf-8"),
                             extensions=["toc", "tables", "fenced_code"])
    return set(re.findall(r'<h[1-6] id="([^"]+)"', html))


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "WARNING" not in log, log
    for page in ("index.html", "own-model/classifier/index.html", "deployment/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_every_docs_page_is_in_the_nav() -> None:
    import yaml

    def pages(items: list[object]) -> list[str]:
        out: list[str] = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += pages(value) if isinstance(value, list) else [str(value)]
        return out

    nav = pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk


def test_the_readme_links_resolve() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    checked = 0
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (readme.parent / path) if path else readme
        assert file.exists(), f"README links {target!r}: {file} does not exist"
        if anchor:
            assert file.suffix == ".md", target
            assert anchor in _heading_ids(file), f"README links {target!r}: no such heading"
        checked += 1
    assert checked >= 10  # the README is a page of links into the site


def test_the_readme_is_a_page_with_its_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    assert re.search(r"^make run +# ", text, re.M) and re.search(r"^make test +# ", text, re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's command
    for page in OWN_MODEL_PAGES:
        assert f"docs/own-model/{page}.md" in text


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(encoding="utf-8"),
                      flags=re.M | re.S)


def _cli_lines(page: Path) -> list[list[str]]:
    """The page's `seqserve pack|verify|inspect` shell lines (continuations joined)."""
    lines = []
    for block in _blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:1] == ["seqserve"] and argv[1] in ("pack", "verify", "inspect"):
                lines.append(argv)
    return lines


@pytest.mark.parametrize("name", OWN_MODEL_PAGES)
def test_a_serve_your_own_model_page_runs_as_written(name: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from seqserve.cli import main

    page = DOCS / "own-model" / f"{name}.md"
    blocks = _blocks(page, "python")
    assert blocks, f"{page} has no Python blocks"
    assert any("seqserve.pack." in b for b in blocks), f"{page} packs nothing"
    other = set(re.findall(r"^```(\S*)\n", page.read_text(encoding="utf-8"), re.M))
    assert other <= {"python", "bash", "json", "text", ""}, other
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    # the blocks run as one script would: a module of their own (classes defined there are
    # found in sys.modules, as a script's are under __main__)
    script = types.ModuleType(f"docs_own_model_{name}")
    monkeypatch.setitem(sys.modules, script.__name__, script)
    for i, block in enumerate(blocks):
        code = compile(block, f"{page.relative_to(ROOT)} [python block {i + 1}]", "exec")
        exec(code, script.__dict__)  # noqa: S102 (the page's own code, as a reader runs it)
    for argv in _cli_lines(page):
        with contextlib.chdir(tmp_path):
            assert main(argv[1:]) == 0, argv
    assert (tmp_path / "model_repository").is_dir()
