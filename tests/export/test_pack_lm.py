"""`seqserve pack lm` and `seqserve.pack.lm` on language models written outside seqserve
(foreign_models.py: the PyTorch word_language_model's RNNModel, time-major, log-softmax
flattened to (seq*batch, V), init_hidden; a batch-first GRU with raw logits and its own step),
with their own character vocabulary and tensor names: packed by the CLI from their ONNX files
(one file for both graphs, or two) and by the Python API from the module, verified, served by
a real server: greedy /generate equals the module's own greedy decode in torch, /score's
log-probs equal the module's to 1e-4; bad graphs are refused naming what to change."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from foreign_models import CharGRULM, RNNModel, char_tokenizer, lm_greedy, lm_log_probs

import seqserve.pack
from seqserve.cli import main
from seqserve.models.errors import BundleError, UserError
from seqserve.models.text.tokenizer_files import load_tokenizer

SPECIALS = ("<pad>", "<unk>", "<eos>")  # the tutorial's corpus marks line ends with <eos>
VOCAB = len(SPECIALS) + 28
PROMPTS = ["the cat", "o'brien sat on", "z"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")
TEXTS = ["anna and zoe", "x", "it's a long way to the top"]
MAX_NEW = 12


def _init(model: torch.nn.Module, gain: float = 2.5) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(gain)
    return model.eval()


def _export(module: torch.nn.Module, example: tuple[Any, ...], path: Path, inputs: list[str],
            outputs: list[str], axes: dict[str, dict[int, str]]) -> Path:
    """As a user would: torch.onnx.export with their own names and dynamic axes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, str(path), input_names=inputs,
                          output_names=outputs, dynamic_axes=axes, opset_version=17,
                          dynamo=False)
    return path


class _Step(torch.nn.Module):
    def __init__(self, m: CharGRULM) -> None:
        super().__init__()
        self.m = m

    def forward(self, token: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.m.step(token, h)


def _tutorial_onnx(model: RNNModel, path: Path) -> Path:
    """The tutorial model exported once, dynamic seq and batch: both graphs in one file."""
    ids = torch.randint(0, VOCAB, (7, 3))
    return _export(model, (ids, model.init_hidden(3)), path, ["input_ids", "h0", "c0"],
                   ["logits", "hn", "cn"],
                   {"input_ids": {0: "seq", 1: "batch"}, "h0": {1: "batch"},
                    "c0": {1: "batch"}, "logits": {0: "n"}, "hn": {1: "batch"},
                    "cn": {1: "batch"}})


def _gru_onnx(model: CharGRULM, d: Path) -> tuple[Path, Path]:
    h = torch.zeros(1, 3, 32)
    pre = _export(model, (torch.randint(0, VOCAB, (3, 7)), h), d / "gru_prefill.onnx",
                  ["tokens", "h"], ["scores", "h_out"],
                  {"tokens": {0: "b", 1: "t"}, "h": {1: "b"}, "scores": {0: "b", 1: "t"},
                   "h_out": {1: "b"}})
    step = _export(_Step(model), (torch.tensor([3, 4, 5]), h), d / "gru_step.onnx",
                   ["tok", "state_in"], ["next_scores", "state_out"],
                   {"tok": {0: "r"}, "state_in": {1: "r"}, "next_scores": {0: "r"},
                    "state_out": {1: "r"}})
    return pre, step


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("packlm")
    repo = d / "repo"
    tok = char_tokenizer(d / "chars.json", SPECIALS)
    lstm = _init(RNNModel("LSTM", VOCAB, 16, 24, 2))
    onnx = _tutorial_onnx(lstm, d / "lm.onnx")
    assert main(["pack", "lm", "--prefill", str(onnx), "--step", str(onnx), "--tokenizer",
                 str(tok), "--bos-token", "<eos>", "--repo", str(repo), "--name", "lstm-cli",
                 "--max-tokens", "32"]) == 0
    seqserve.pack.lm(lstm, tokenizer=tok, specials={"bos": "<eos>"}, repo=repo,
                     name="lstm-api", max_tokens=32, progress=False)
    gru = _init(CharGRULM(VOCAB))
    pre, step = _gru_onnx(gru, d)
    config = d / "tokenizer_config.json"  # a chat template as Hugging Face configs carry one
    config.write_text(json.dumps({"chat_template": CHAT_TEMPLATE, "bos_token": "<eos>"}))
    assert main(["pack", "lm", "--prefill", str(pre), "--step", str(step), "--tokenizer",
                 str(tok), "--bos-token", "2", "--repo", str(repo), "--name", "gru-cli",
                 "--chat-template", str(config),
                 "--prefill-input-names", "tokens,h", "--prefill-output-names", "scores,h_out",
                 "--step-input-names", "tok,state_in", "--step-output-names",
                 "next_scores,state_out", "--max-tokens", "32"]) == 0
    return {"repo": repo, "dir": d, "tok": tok, "lstm": lstm, "gru": gru, "onnx": onnx}


@pytest.fixture(scope="module")
def server(packed: dict[str, Any]) -> Iterator[str]:
    from service_fakes import serve_repo

    with serve_repo(packed["repo"], max_wait_ms=5, max_tokens=32) as url:
        yield url


def _models(packed: dict[str, Any]) -> list[tuple[str, torch.nn.Module, Any, bool]]:
    """(bundle, eager module, its initial hidden for one row, time-major)."""
    lstm, gru = packed["lstm"], packed["gru"]
    return [("lstm-cli", lstm, lambda: lstm.init_hidden(1), True),
            ("lstm-api", lstm, lambda: lstm.init_hidden(1), True),
            ("gru-cli", gru, lambda: torch.zeros(1, 1, 32), False)]


def test_packed_lms_generate_greedily_as_the_module(packed: dict[str, Any], server: str
                                                    ) -> None:
    tok = load_tokenizer(packed["tok"])
    bos = eos = tok.encode("<eos>")[0]
    assert (bos, tok.eos_id) == (2, 2)
    compared = 0
    with httpx.Client(base_url=server, timeout=60) as c:
        for name, model, hidden, time_major in _models(packed):
            r = c.post(f"/v1/models/{name}/generate",
                       json={"prompts": PROMPTS, "max_new_tokens": MAX_NEW, "temperature": 0,
                             "logprobs": True})
            assert r.status_code == 200, (name, r.text)
            results = sorted(r.json()["results"], key=lambda x: x["prompt_index"])
            for prompt, res in zip(PROMPTS, results, strict=True):
                want, lps, finish = lm_greedy(model, [bos, *tok.encode(prompt)], hidden(),
                                              eos, MAX_NEW, time_major)
                assert res["text"] == tok.decode(want), (name, prompt)
                assert res["tokens"] == [tok.id_to_piece(i) for i in want]
                assert res["finish_reason"] == finish
                assert max((abs(a - b) for a, b in zip(res["logprobs"], lps, strict=True)),
                           default=0.0) < 1e-4
                compared += 1
    assert compared == 9


def test_packed_lms_score_as_the_module(packed: dict[str, Any], server: str) -> None:
    tok = load_tokenizer(packed["tok"])
    bos = tok.encode("<eos>")[0]
    with httpx.Client(base_url=server, timeout=60) as c:
        for name, model, hidden, time_major in _models(packed):
            r = c.post(f"/v1/models/{name}/score", json={"texts": TEXTS})
            assert r.status_code == 200, (name, r.text)
            for text, res in zip(TEXTS, r.json()["results"], strict=True):
                ids = tok.encode(text)
                lp, _ = lm_log_probs(model, [bos, *ids], hidden(), time_major)
                want = [float(lp[t, i]) for t, i in enumerate(ids)]
                assert res["num_tokens"] == len(ids)
                assert max(abs(a - b) for a, b in zip(res["logprobs"], want, strict=True)
                           ) < 1e-4, (name, text)


def test_packed_lm_bundles_verify_and_record_their_source(packed: dict[str, Any]) -> None:
    repo = packed["repo"]
    for name in ("lstm-cli", "lstm-api", "gru-cli"):
        assert main(["verify", str(repo / name / "1")]) == 0
    cli = json.loads((repo / "lstm-cli" / "1" / "manifest.json").read_text())
    assert cli["task"] == "lm" and cli["parity"]["passed"]
    assert cli["tokenizer"]["bos_id"] == cli["tokenizer"]["eos_id"] == 2
    assert cli["source"]["state"] == [{"layers": 2, "hidden": 24}] * 2
    assert cli["source"]["sequence_lens"] is True  # the tutorial graph reads no lengths
    assert cli["source"]["prefill_names"]["time_major"] is True
    gru = json.loads((repo / "gru-cli" / "1" / "manifest.json").read_text())
    assert gru["source"]["step_names"]["time_major"] is False
    assert gru["chat_template"] == CHAT_TEMPLATE and "chat_template" not in cli
    api = json.loads((repo / "lstm-api" / "1" / "manifest.json").read_text())
    assert api["parity"]["reference"] == "eager"  # each prompt run alone in torch
    assert set(api["parity"]["parity_max_abs"]) == {"onnx"}
    assert api["source"]["sequence_lens"] is True


class _NaiveLengths(torch.nn.Module):
    """A prefill that takes lengths but ignores them: its state is after the padding."""

    def __init__(self, m: CharGRULM) -> None:
        super().__init__()
        self.m = m

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, h: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        logits, h = self.m(tokens, h)
        return logits + 0 * lengths[:, None, None], h


def test_bad_lm_graphs_are_refused_naming_the_fix(packed: dict[str, Any], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    tok, onnx = packed["tok"], packed["onnx"]
    repo = tmp_path / "r"
    base = ["pack", "lm", "--step", str(onnx), "--tokenizer", str(tok), "--bos-token",
            "<eos>", "--repo", str(repo), "--max-tokens", "16"]
    # a tokenizer of another size than the model's output layer
    small = char_tokenizer(tmp_path / "small.json", SPECIALS, letters=list("abc"))
    assert main([*base[:5], str(small), *base[6:], "--prefill", str(onnx),
                 "--name", "vocab"]) == 2
    assert "31 log-probs per position but the tokenizer has 6 tokens" in capsys.readouterr().err
    # a name that is not in the graph
    assert main([*base, "--prefill", str(onnx), "--name", "names",
                 "--prefill-input-names", "input_ids,h,c0"]) == 2
    assert "--prefill-input-names ['h']: not in the graph" in capsys.readouterr().err
    # a prefill whose state is another size than the step's
    other = _init(RNNModel("LSTM", VOCAB, 16, 20, 2))
    wide = _tutorial_onnx(other, tmp_path / "other.onnx")
    assert main([*base, "--prefill", str(wide), "--name", "state"]) == 2
    err = capsys.readouterr().err
    assert "prefill input state h0 has shape [2, 'batch', 20]" in err and "24" in err
    # no bos by any usual name
    assert main([*base[:6], "--repo", str(repo), "--prefill", str(onnx), "--name", "bos"]) == 2
    assert "--bos-token" in capsys.readouterr().err
    # a prefill that takes lengths and ignores them: refused by batch invariance
    gru = packed["gru"]
    naive = _export(_NaiveLengths(gru), (torch.randint(0, VOCAB, (3, 7)),
                                        torch.tensor([7, 4, 2]), torch.zeros(1, 3, 32)),
                    tmp_path / "naive.onnx", ["tokens", "n", "h"], ["scores", "h_out"],
                    {"tokens": {0: "b", 1: "t"}, "n": {0: "b"}, "h": {1: "b"},
                     "scores": {0: "b", 1: "t"}, "h_out": {1: "b"}})
    _, step = _gru_onnx(gru, tmp_path)
    with pytest.raises(BundleError) as refused:
        from seqserve.export.pack.files import pack_lm_files

        pack_lm_files(repo=repo, name="naive", prefill=naive, step=step, tokenizer=tok,
                      specials={"bos": "<eos>"}, max_tokens=16, progress=False)
    msg = str(refused.value)
    assert "batch invariance of naive.onnx's state is broken" in msg
    assert "seqserve.pack.length_aware" in msg and "seqserve.pack.lm" in msg
    assert not repo.exists() or not any(repo.rglob("manifest.json"))
    # the Python API: a module whose output layer does not match the tokenizer
    with pytest.raises(UserError, match="tokenizer has 6 tokens"):
        seqserve.pack.lm(packed["lstm"], tokenizer=small, specials={"bos": "<eos>"},
                         repo=repo, name="api-vocab", progress=False)


def test_packed_graphs_with_initial_states_continue_cached_prefixes(packed: dict[str, Any],
                                                                     server: str) -> None:
    """A user's graph that takes its initial states is packed with the contract's
    initial_state (schema 3): the prefix cache runs only a prompt's remainder and answers as
    recomputing does; the Python API's wrapper starts from zeros (no initial_state): its
    prompts are recomputed, the same answers."""
    from seqserve.export.manifest import load_bundle

    prompt = PROMPTS[0] * 3
    with httpx.Client(base_url=server, timeout=60) as c:
        for name, takes in (("lstm-cli", True), ("gru-cli", True), ("lstm-api", False)):
            manifest = load_bundle(packed["repo"] / name / "1")
            inputs = [t.name for t in manifest.graphs["prefill"].inputs]
            assert ("initial_state" in inputs) == takes == (manifest.state_dim is not None)
            body = {"prompt": prompt, "max_new_tokens": MAX_NEW, "temperature": 0,
                    "logprobs": True}
            first, again = (c.post(f"/v1/models/{name}/generate", json=body).json()
                            for _ in range(2))
            assert again["results"] == first["results"], name
            assert (again["usage"]["cached_tokens"] > 0) == takes, (name, again["usage"])
            described = c.get(f"/v1/models/{name}").json()
            assert "prefix_cache" in json.dumps(described)


def test_pack_lm_chat_template_served_and_checked(packed: dict[str, Any], server: str,
                                                  tmp_path: Path) -> None:
    """--chat-template from a tokenizer_config.json: the packed model serves chat, its
    answer the completion of the rendered conversation; a template that does not compile or
    render is refused when packing, naming the option."""
    messages = [{"role": "user", "content": "the cat"}]
    body = {"model": "gru-cli", "max_tokens": 5, "temperature": 0}
    chat = httpx.post(f"{server}/v1/chat/completions", json={**body, "messages": messages},
                      timeout=60)
    text = httpx.post(f"{server}/v1/completions", json={**body, "prompt": "user the cat "
                                                        "assistant "}, timeout=60)
    assert chat.status_code == text.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] == text.json()["choices"][0]["text"]
    served = httpx.get(f"{server}/v1/models/gru-cli/tokenizer.json", timeout=60)
    from tokenizers import Tokenizer as HFTokenizer  # the bundle's own tokenizer.json

    assert json.loads(served.content) == json.loads(
        HFTokenizer.from_file(str(packed["tok"])).to_str())
    for bad in ("{% for m in messages %}", "{{ messages[5]['content'] }}"):
        assert main(["pack", "lm", "--prefill", str(packed["onnx"]), "--step",
                     str(packed["onnx"]), "--tokenizer", str(packed["tok"]), "--bos-token",
                     "<eos>", "--repo", str(tmp_path), "--name", "bad",
                     "--chat-template", bad]) != 0
        assert not (tmp_path / "bad").exists()
