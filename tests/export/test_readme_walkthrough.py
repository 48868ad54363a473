"""The "Serve your own model" walkthrough (docs/own-model/index.md, which the README links),
run as written: its fenced `bash` blocks, line by line, in a fresh folder (`examples/` linked
in): the examples' training scripts (which also pack with the Python API), `seqserve pack`
from their ONNX files, `seqserve serve` (on a free port) and the curl requests (sent with
httpx). The served answers are compared with the eager modules the scripts trained (loaded
from their weights.pt): labels equal, probabilities within 1e-4, translations equal at beam 1
and beam 5 to a plainly written beam search, the language model's greedy generations equal
the module's own greedy decode and its scored log-probs the module's within 1e-4."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from process_support import Server, wait_ready
from service_fakes import free_port

from seqserve.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-model" / "index.md"
SECTION = "## Walkthrough: the examples"


def readme_commands() -> list[list[str]]:
    """The section's shell commands (continuations joined, comments dropped), as argv."""
    text = PAGE.read_text(encoding="utf-8")
    assert SECTION in text, f"{PAGE} lost its walkthrough section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _serving(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[Server]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "seqserve.cli", *argv[1:],
                             "--port", str(port), "--grpc-port", "0"],
                            cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}")
    try:
        wait_ready(server, timeout=120)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _curl(argv: list[str]) -> tuple[str, dict[str, Any] | None]:
    """(path, JSON body) of a walkthrough curl line."""
    url = next(a for a in argv[1:] if a.startswith(("localhost", "http")))
    body = argv[argv.index("-d") + 1] if "-d" in argv else None
    path = "/" + url.split("://")[-1].split("/", 1)[1]
    return path, None if body is None else json.loads(body)


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Runs the walkthrough's commands; yields the folder and the curl answers."""
    work = tmp_path_factory.mktemp("walkthrough")
    (work / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "SEQSERVE_LOG_LEVEL": "warning",
           # the walkthrough's `seqserve serve`, but stopped without the load-balancer delay
           "SEQSERVE_SHUTDOWN_DELAY_S": "0"}
    commands = readme_commands()
    serve = [c for c in commands if c[:2] == ["seqserve", "serve"]]
    assert len(serve) == 1, commands
    answers: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    before = commands[:commands.index(serve[0])]
    for argv in before:
        started = time.perf_counter()
        if argv[0] == "python":
            done = subprocess.run([sys.executable, *argv[1:]], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, (argv, done.stdout[-3000:], done.stderr[-3000:])
        elif argv[0] == "seqserve":  # what the `seqserve` entry point runs, in this process
            with contextlib.chdir(work):
                assert main(argv[1:]) == 0, argv
        else:
            raise AssertionError(f"the walkthrough runs {argv[0]!r}, which this test cannot")
        print(f"{time.perf_counter() - started:5.1f} s  {shlex.join(argv)[:100]}")
    after = commands[commands.index(serve[0]) + 1:]
    assert after and all(a[0] == "curl" for a in after), after
    with _serving(serve[0], work, env) as server, httpx.Client(base_url=server.url,
                                                               timeout=60) as client:
        for argv in after:
            path, body = _curl(argv)
            assert body is not None, argv
            r = client.post(path, json=body)
            assert r.status_code == 200, (argv, r.text)
            answers.append((path, body, r.json()))
        yield {"work": work, "url": server.url, "answers": answers}


def _classifier(work: Path) -> tuple[Any, Any]:
    from tokenizers import Tokenizer

    ex = _load("names_classifier")
    tok = Tokenizer.from_file(str(work / "work/names/tokenizer.json"))
    model = ex.CharGRU(tok.get_vocab_size(), len(ex.LABELS))
    model.load_state_dict(torch.load(work / "work/names/weights.pt"))
    return model.eval(), tok


def _check_classified(model: Any, tok: Any, labels: list[str], texts: list[str],
                      results: list[dict[str, Any]]) -> None:
    assert len(results) == len(texts)
    for text, res in zip(texts, results, strict=True):
        ids = tok.encode(text).ids
        with torch.no_grad():
            p = torch.softmax(model(torch.tensor([ids]), torch.tensor([len(ids)]))[0], -1)
        assert res["label"] == labels[int(p.argmax())], text
        assert abs(res["score"] - float(p.max())) < 1e-4
        for top in res["top_k"]:
            assert abs(top["probability"] - float(p[labels.index(top["label"])])) < 1e-4


def test_walkthrough_classifiers_answer_as_the_eager_model(walkthrough: dict[str, Any]
                                                           ) -> None:
    model, tok = _classifier(walkthrough["work"])
    labels = (walkthrough["work"] / "work/names/labels.txt").read_text().split()
    asked = [(p, b, a) for p, b, a in walkthrough["answers"] if p.endswith("/classify")]
    assert {p.split("/")[3] for p, _, _ in asked} == {"names", "names-py"}
    for _, body, answer in asked:
        _check_classified(model, tok, labels, body["texts"], answer["results"])
    more = ["Schmidtke", "Ferrante", "Lefebure", "O'Connor", "Vögele", "D'Alessio", "x",
            "Abernathy-Smith", "Giordanelli", "Moreau"]
    with httpx.Client(base_url=walkthrough["url"], timeout=60) as client:
        for name in ("names", "names-py"):
            r = client.post(f"/v1/models/{name}/classify", json={"texts": more, "top_k": 4})
            assert r.status_code == 200, r.text
            _check_classified(model, tok, labels, more, r.json()["results"])


def _reference(ex: ModuleType, encoder: Any, decoder: Any, ids: list[int], beam: int,
               max_len: int) -> list[int]:
    from reference_search import reference_beam_search

    with torch.no_grad():
        memory, hidden = encoder(torch.tensor([ids]), torch.tensor([len(ids)]))

    def step(prev: int, state: np.ndarray, mem: np.ndarray) -> tuple[np.ndarray, ...]:
        with torch.no_grad():
            logits, h, att = decoder(torch.tensor([prev]), torch.from_numpy(state)[:, None],
                                     torch.from_numpy(mem)[None],
                                     torch.ones(1, len(mem), dtype=torch.bool))
        return torch.log_softmax(logits[0], -1).numpy(), att[0].numpy(), h[:, 0].numpy()

    hyps = reference_beam_search(step, memory[0].numpy(), hidden[:, 0].numpy(), bos=ex.SOS,
                                 eos=ex.EOS, max_len=max_len, beam=beam, n_best=1)
    tokens = hyps[0].tokens
    return tokens[:-1] if tokens and tokens[-1] == ex.EOS else tokens


def test_walkthrough_translators_answer_as_the_eager_model(walkthrough: dict[str, Any]
                                                           ) -> None:
    from tokenizers import Tokenizer

    from seqserve.service.scheduling.search import DecodeLimits, SearchOptions, max_steps

    work = walkthrough["work"]
    ex = _load("digits_translator")
    src = Tokenizer.from_file(str(work / "work/digits/source.json"))
    tgt = Tokenizer.from_file(str(work / "work/digits/target.json"))
    weights = torch.load(work / "work/digits/weights.pt")
    hidden = weights["encoder"]["embedding.weight"].shape[1]
    encoder = ex.EncoderRNN(src.get_vocab_size(), hidden)
    decoder = ex.AttnDecoderRNN(hidden, tgt.get_vocab_size())
    encoder.load_state_dict(weights["encoder"])
    decoder.load_state_dict(weights["decoder"])
    encoder.eval()
    decoder.eval()
    limits = DecodeLimits(bos_id=ex.SOS, eos_id=ex.EOS, vocab_size=tgt.get_vocab_size(),
                          max_decode_length=128)

    def want(text: str, beam: int) -> list[int]:
        ids = src.encode(text).ids
        return _reference(ex, encoder, decoder, ids, beam,
                          max_steps(SearchOptions(beam_size=beam), len(ids), limits))

    asked = [(p, b, a) for p, b, a in walkthrough["answers"] if p.endswith("/translate")]
    assert {p.split("/")[3] for p, _, _ in asked} == {"digits", "digits-py"}
    for _, body, answer in asked:
        for text, res in zip(body["texts"], answer["results"], strict=True):
            ids = want(text, body.get("beam_size", 5))
            assert res["hypotheses"][0]["token_ids"] == ids, text
            assert res["translation"] == tgt.decode(ids)
    texts = ["0", "13", "8675309", "4 4 4", "100000", "271828"]
    compared = 0
    with httpx.Client(base_url=walkthrough["url"], timeout=60) as client:
        for beam in (1, 5):
            expected = [want(t, beam) for t in texts]
            for name in ("digits", "digits-py"):
                r = client.post(f"/v1/models/{name}/translate",
                                json={"texts": texts, "beam_size": beam})
                assert r.status_code == 200, r.text
                got = [res["hypotheses"][0]["token_ids"] for res in r.json()["results"]]
                assert got == expected, (name, beam)
                compared += len(texts)
    assert compared == 24
    # the model learned its task: the walkthrough's own example reads as it should
    assert tgt.decode(want("2024", 5)) == "two zero two four"


def test_walkthrough_language_models_answer_as_the_eager_model(walkthrough: dict[str, Any]
                                                               ) -> None:
    from foreign_models import lm_greedy, lm_log_probs

    from seqserve.models.text.tokenizer_files import load_tokenizer

    work = walkthrough["work"]
    ex = _load("zen_lm")
    tok = load_tokenizer(work / "work/zen/tokenizer.json")
    model = ex.RNNModel("LSTM", tok.vocab_size, 32, 128, 1)
    model.load_state_dict(torch.load(work / "work/zen/weights.pt"))
    model.eval()
    eos = tok.encode(ex.EOS)[0]
    asked = {p.split("/")[3]: (b, a) for p, b, a in walkthrough["answers"]
             if p.endswith(("/generate", "/score"))}
    assert set(asked) == {"zen", "zen-py"}
    body, answer = asked["zen"]
    for prompt, res in zip(body["prompts"], answer["results"], strict=True):
        want, _, finish = lm_greedy(model, [eos, *tok.encode(prompt)], model.init_hidden(1),
                                    eos, body["max_new_tokens"], True)
        assert (res["text"], res["finish_reason"]) == (tok.decode(want), finish), prompt
    # the model learned its text: the walkthrough's prompt goes on as the Zen of Python does
    assert answer["results"][0]["text"] == " better than ugly."
    body, answer = asked["zen-py"]
    for text, res in zip(body["texts"], answer["results"], strict=True):
        ids = tok.encode(text)
        lp, _ = lm_log_probs(model, [eos, *ids], model.init_hidden(1), True)
        want = [float(lp[t, i]) for t, i in enumerate(ids)]
        assert max(abs(a - b) for a, b in zip(res["logprobs"], want, strict=True)) < 1e-4
    prompts = ["now is", "in the face of", "flat is"]
    with httpx.Client(base_url=walkthrough["url"], timeout=60) as client:
        for name in ("zen", "zen-py"):
            r = client.post(f"/v1/models/{name}/generate",
                            json={"prompts": prompts, "temperature": 0, "max_new_tokens": 30})
            assert r.status_code == 200, r.text
            for prompt, res in zip(prompts, r.json()["results"], strict=True):
                want, _, _ = lm_greedy(model, [eos, *tok.encode(prompt)],
                                       model.init_hidden(1), eos, 30, True)
                assert res["text"] == tok.decode(want), (name, prompt)
