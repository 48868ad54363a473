"""One table of bad inputs, sent to every POST route (v1, KServe V1 `:predict` and OIP v2,
default and pinned version, classifier, translator and tagger; a language model's generate and
score, the OIP generate extension's generate and generate_stream, vLLM's /tokenize and OpenAI's
chat completions (each text a user message, to a model with a chat template); a
feature-sequence model's predict, KServe V1 predict and OIP infer) of a real server over one
keep-alive connection per route.

For every case and route: a 4xx with a JSON `{"error": ...}` body, no 5xx, no reset and no
hang (the next, good request on the same connection gets its 200), and the server stays
ready. A case is written once: texts and options become a v1 body or an OIP body by the
route's protocol (KServe V1: texts as `instances`, options as unknown fields), series become a
predict body, KServe V1 `instances` or an OIP `features` tensor (and a bad body for every text
route); raw bodies are sent as they are, with the case's headers (content types
and codings). A case may name the one status it must get.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from server_support import RawConnection
from service_fakes import serve_in_thread

from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

LIMITS = {"max_texts": 4, "max_chars": 500, "max_tokens": 64, "max_body_bytes": 200_000}
MODELS = {"classifier": "tiny-clf", "translator": "tiny-mt", "tagger": "tiny-tag",
          "lm": "tiny-lm", "series": "tiny-series"}
V1_VERB = {"classifier": "classify", "translator": "translate", "tagger": "tag"}
LM_VERBS = ("generate", "score")
"""A language model's v1 POST routes; its texts go out as `prompts` (generate) or `texts`."""
OIP_LM_VERBS = ("v2generate", "v2generate_stream")
"""The OIP generate extension: one text as `text_input`, options as `parameters`."""
ROUTES = [(task, protocol, pinned) for task in MODELS if task not in ("lm", "series")
          for protocol in ("v1", "kserve", "v2") for pinned in (False, True)]
ROUTES += [("series", protocol, pinned) for protocol in ("predict", "kserve", "v2")
           for pinned in (False, True)]
ROUTES += [("lm", verb, pinned) for verb in LM_VERBS + OIP_LM_VERBS
           for pinned in (False, True)]
TOKENIZE = ("tokenize",)
"""vLLM's /tokenize: one text as `prompt`, the model named in the body (no version); any
other text is valid there, empty included (bos alone), and no token limit applies."""
CHAT = ("chat",)
"""OpenAI's /v1/chat/completions: each text a user message, options as fields, errors in
OpenAI's shape (`{"error": {"message", ...}}`)."""
CHAT_MODEL = "tiny-chat"
TABLE_ROUTES = ROUTES + [("lm", "tokenize", False), ("lm", "chat", False)]


@dataclass(frozen=True)
class Bad:
    """One bad input: `texts` + `options` (built per protocol), or a `raw` body, or a whole
    OIP `oip` body (which is also a bad v1 body: it has no `texts`)."""

    name: str
    texts: Any = field(default_factory=lambda: ["one two"])
    options: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None
    oip: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    valid_for: tuple[str, ...] = ()
    """Protocols for which this input is in fact valid (skipped there)."""
    series: Any = None
    """A feature-sequence input (steps of 3 values): a predict body, an OIP `features`
    tensor (shape from its nesting) to an infer route, a bad body to every text route."""
    status: int | None = None
    """The one status this input must get (None: any 4xx)."""

    def body(self, protocol: str, task: str = "") -> bytes:
        if self.raw is not None:
            return self.raw
        if self.oip is not None:
            return json.dumps(self.oip).encode()
        if self.series is not None:
            if protocol == "v2":
                return json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                               "shape": _shape(self.series),
                                               "data": self.series}]}).encode()
            if protocol == "kserve":
                return json.dumps({"instances": self.series}).encode()
            return json.dumps({"series": self.series}).encode()
        if protocol == "kserve":  # KServe V1: the texts are instances; options unknown fields
            return json.dumps({"instances": self.texts, **self.options}).encode()
        if protocol == "predict":
            return json.dumps({"texts": self.texts, **self.options}).encode()
        if protocol == "generate":
            return json.dumps({"prompts": self.texts, **self.options}).encode()
        one = self.texts[0] if isinstance(self.texts, list) and len(self.texts) == 1 \
            else self.texts  # one text; several (or none) stay a list: refused
        if protocol in TOKENIZE:
            return json.dumps({"model": MODELS["lm"], "prompt": one, **self.options}).encode()
        if protocol in CHAT:
            messages = [{"role": "user", "content": t} for t in self.texts] \
                if isinstance(self.texts, list) else self.texts
            return json.dumps({"model": CHAT_MODEL, "messages": messages,
                               **self.options}).encode()
        if protocol in OIP_LM_VERBS:
            oip_body: dict[str, Any] = {"text_input": one}
            if self.options:
                oip_body["parameters"] = self.options
            return json.dumps(oip_body).encode()
        if protocol in ("v1", "score"):
            return json.dumps({"texts": self.texts, **self.options}).encode()
        shape = [len(self.texts)] if isinstance(self.texts, list) else [2]
        body: dict[str, Any] = {"inputs": [{"name": "text", "datatype": "BYTES",
                                            "shape": shape, "data": self.texts}]}
        if self.options:
            body["parameters"] = self.options
        return json.dumps(body).encode()


def oip(data: Any, shape: list[int] | None = None, datatype: str = "BYTES",
        name: str = "text", **extra: Any) -> dict[str, Any]:
    inp = {"name": name, "datatype": datatype, "shape": [1] if shape is None else shape,
           "data": data}
    return {"inputs": [inp], **extra}


def oip_binary(inputs: list[dict[str, Any]], tail: bytes = b"") -> dict[str, Any]:
    """`raw` and `headers` of a body in the binary tensor data extension: the JSON header
    (its length in Inference-Header-Content-Length), then `tail`."""
    head = json.dumps({"inputs": inputs}).encode()
    return {"raw": head + tail, "headers": {"content-type": "application/octet-stream",
                                            "inference-header-content-length": str(len(head))}}


def _features(data: Any, shape: list[int]) -> dict[str, Any]:
    return oip(data, shape=shape, datatype="FP32", name="features")["inputs"][0]


def _lengths(data: Any) -> dict[str, Any]:
    return oip(data, shape=[len(data)], datatype="INT64", name="lengths")["inputs"][0]


def _shape(data: Any) -> list[int]:
    """The shape a nested list claims by its first elements (ragged data: still a shape)."""
    shape = []
    while isinstance(data, list):
        shape.append(len(data))
        data = data[0] if data else None
    return shape


STEP = [10.0, -2.0, 0.5]
DEEP = 50_000
BOMB = b"0" * 20_000_000
"""Decompresses to 100 times max_body_bytes; sent as about 20 KB."""
CASES = [
    # -- texts: encodings and characters
    Bad("lone high surrogate", texts=["two \ud800 hundred"]),
    Bad("lone low surrogate", texts=["\udfff"]),
    Bad("invalid utf-8", raw=b'{"texts": ["\xff\xfe one"]}'),
    Bad("utf-8 encoded surrogate", raw=b'{"texts": ["\xed\xa0\x80"]}'),
    Bad("nul character", texts=["one\u0000two"]),
    Bad("empty text", texts=[""], valid_for=TOKENIZE + CHAT),  # chat: the template's text
    Bad("whitespace only", texts=["  \t\n "], valid_for=TOKENIZE + CHAT),
    # -- texts: sizes
    Bad("more characters than max_chars", texts=["x" * 501]),
    Bad("more tokens than max_tokens", texts=["one " * 120], valid_for=TOKENIZE),
    Bad("more texts than max_texts", texts=["one"] * 5, valid_for=CHAT),  # 5 messages, 1 prompt
    Bad("no texts", texts=[]),
    Bad("body over max_body_bytes", raw=b'{"texts": ["' + b"x" * 200_001 + b'"]}'),
    # -- texts: types
    Bad("text is a number", texts=[5]),
    Bad("text is null", texts=[None], valid_for=CHAT),  # a message's null content: empty
    Bad("text is a list", texts=[["one"]]),
    Bad("text is an object", texts=[{"text": "one"}], valid_for=("kserve",)),  # {"text": ...}
    Bad("text is an object with more", texts=[{"text": "one", "top_k": 2}]),
    Bad("text is a bool", texts=[True]),
    Bad("texts is a string", texts="one two", valid_for=OIP_LM_VERBS + TOKENIZE),  # one text
    # -- the body
    Bad("malformed json", raw=b'{"texts": ['),
    Bad("empty body", raw=b""),
    Bad("json null", raw=b"null"),
    Bad("json array", raw=b'["one"]'),
    Bad("json string", raw=b'"one"'),
    Bad("trailing garbage", raw=b'{"texts": ["one"]} extra'),
    Bad("deeply nested arrays", raw=b"[" * DEEP + b"]" * DEEP),
    Bad("deeply nested field", raw=b'{"texts": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
    Bad("number with 5000 digits", raw=b'{"texts": ["one"], "top_k": 1' + b"0" * 5000 + b"}"),
    Bad("unknown field", options={"bogus": 1}),
    # -- content types and codings: JSON (UTF-8) or none, OIP infer also binary; gzip, deflate
    Bad("content type text/plain", headers={"content-type": "text/plain"}, status=415),
    Bad("content type form", headers={"content-type": "application/x-www-form-urlencoded"},
        status=415),
    Bad("content type multipart", raw=b'--x\r\ncontent-disposition: form-data; name="texts"'
        b'\r\n\r\none\r\n--x--\r\n', headers={"content-type": "multipart/form-data; boundary=x"},
        status=415),
    Bad("content type xml", headers={"content-type": "application/xml"}, status=415),
    Bad("content type json suffix in utf-16",
        headers={"content-type": "application/vnd.api+json; charset=UTF-16"}, status=415),
    Bad("content type charset utf-16", headers={"content-type": "application/json; charset=utf-16"},
        status=415),
    Bad("content type binary outside OIP infer",
        headers={"content-type": "application/octet-stream"}, status=415, valid_for=("v2",)),
    Bad("content encoding br", headers={"content-encoding": "br"}, status=415),
    Bad("content encoding zstd", headers={"content-encoding": "zstd"}, status=415),
    Bad("content encoding unknown", headers={"content-encoding": "bogus"}, status=415),
    Bad("content encoding stacked", headers={"content-encoding": "gzip, gzip"}, status=415),
    Bad("gzip bomb", raw=gzip.compress(BOMB), headers={"content-encoding": "gzip"}, status=413),
    Bad("deflate bomb", raw=zlib.compress(BOMB), headers={"content-encoding": "deflate"},
        status=413),
    Bad("gzip body that is not gzip", raw=b'{"texts": ["one"]}',
        headers={"content-encoding": "gzip"}, status=400),
    Bad("gzip body truncated", raw=gzip.compress(b'{"texts": ["one"]}')[:-12],
        headers={"content-encoding": "gzip"}, status=400),
    Bad("gzip of malformed json", raw=gzip.compress(b'{"texts": ['),
        headers={"content-encoding": "gzip"}),
    # -- options: out of range, wrong type, combinations
    Bad("negative top_k", options={"top_k": -5}),
    Bad("fractional top_k", options={"top_k": 2.5}),  # 123.0 is an integer (JSON Schema)
    Bad("infinite top_k", raw=b'{"texts": ["one"], "top_k": 1e400}'),
    Bad("NaN top_k", raw=b'{"texts": ["one"], "top_k": NaN}'),
    Bad("beam_size zero", options={"beam_size": 0}),
    Bad("beam_size 1000", options={"beam_size": 1000}),
    Bad("beam_size as a string", options={"beam_size": "5"}),
    Bad("sampling with a beam", options={"temperature": 0.7, "beam_size": 5}),
    Bad("n_best over beam_size", options={"beam_size": 2, "n_best": 3}),
    Bad("return_attention as a string", options={"return_attention": "yes"}),
    Bad("min_length over the schema limit", options={"min_length": 5000}),
    Bad("beam_size over the schema limit", options={"beam_size": 17}),
    Bad("max_length over the schema limit", options={"max_length": 5000}),
    Bad("negative length_penalty", options={"length_penalty": -0.1}),
    Bad("negative coverage_penalty", options={"coverage_penalty": -1}),
    Bad("top_p over 1", options={"top_p": 1.5}),
    Bad("temperature zero", options={"temperature": 0},
        valid_for=("generate", *OIP_LM_VERBS, *CHAT)),  # greedy
    Bad("negative no_repeat_ngram_size", options={"no_repeat_ngram_size": -1}),
    Bad("max_length_ratio zero", options={"max_length_ratio": 0}),
    # -- OIP shapes, dtypes and fields (to a v1 route these are bodies without texts)
    Bad("oip wrong datatype", oip=oip([1.0], datatype="FP32")),
    Bad("oip shape larger than data", oip=oip(["one"], shape=[3])),
    Bad("oip negative dim", oip=oip(["one"], shape=[-1])),
    Bad("oip text of two columns", oip=oip([["one", "two"]], shape=[1, 2])),  # [n, 1] is fine
    Bad("oip nested data under a flat shape", oip=oip([[["one"]]], shape=[1])),
    Bad("oip wrong input name", oip=oip(["one"], name="txt")),
    Bad("oip no data", oip={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}]}),
    Bad("oip no inputs", oip={"inputs": []}),
    Bad("oip empty text tensor", oip=oip([], shape=[0])),
    Bad("oip two inputs", oip={"inputs": [oip(["a"])["inputs"][0], oip(["b"])["inputs"][0]]}),
    Bad("oip unknown requested output", oip=oip(["one"], outputs=[{"name": "nope"}])),
    Bad("oip unknown top-level field", oip=oip(["one"], bogus=1)),
    Bad("oip binary size beyond the body",
        oip={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                         "parameters": {"binary_data_size": 99}}]}),
    Bad("oip bad header length", oip=oip(["one"]),
        headers={"inference-header-content-length": "abc"}),
    Bad("oip parameters not an object", oip=oip(["one"], parameters=[1, 2])),
    Bad("oip binary_data_output not a bool",
        oip=oip(["one"], parameters={"binary_data_output": "yes"})),
    Bad("oip negative timeout", oip=oip(["one"], parameters={"timeout": -1})),
    Bad("oip output binary_data not a bool",
        oip=oip(["one"], outputs=[{"name": "label", "parameters": {"binary_data": 1}}])),
    Bad("oip classification extension",
        oip=oip(["one"], outputs=[{"name": "label", "parameters": {"classification": 2}}])),
    Bad("oip unknown output parameter",
        oip=oip(["one"], outputs=[{"name": "label", "parameters": {"bogus": True}}])),
    Bad("oip id not a string", oip=oip(["one"], id=5)),
    Bad("oip binary_data_size null",
        oip={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["one"],
                         "parameters": {"binary_data_size": None}}]}),
    # -- feature series (steps of 3 values): values, widths, shapes, sizes
    Bad("series value NaN", series=[[STEP, [float("nan"), 0.0, 1.0]]]),  # a JSON NaN literal
    Bad("series value infinite", series=[[[float("inf"), 0.0, 1.0]]]),
    Bad("series value beyond float32", raw=b'{"series": [[[1e39, 0, 1]]]}'),
    Bad("series value 1e400", raw=b'{"series": [[[1e400, 0, 1]]]}'),
    Bad("series value a string", series=[[["1", 0.0, 1.0]]]),
    Bad("series value null", series=[[[None, 0.0, 1.0]]]),
    Bad("series value a bool", series=[[[True, 0.0, 1.0]]]),
    Bad("series steps too narrow", series=[[[1.0, 2.0]]]),
    Bad("series steps too wide", series=[[STEP + [1.0]]]),
    Bad("series bare numbers for steps", series=[[1.0, 2.0, 3.0]]),
    Bad("series ragged steps", series=[[STEP, [1.0, 2.0], STEP]]),
    Bad("series ragged series", series=[[STEP, STEP], [STEP]],
        valid_for=("predict", "kserve")),  # series of different lengths: a ragged OIP tensor
    Bad("series empty", series=[[]]),
    Bad("series no series", series=[]),
    Bad("series over-long", series=[[STEP] * 17]),
    Bad("series too many", series=[[STEP]] * 5),
    Bad("series not a list", raw=b'{"series": 5}'),
    # -- sessions (the tiny series model is stateful): ids, flags, one series per chunk
    Bad("session id too long", raw=json.dumps({"series": [[STEP]], "session": "x" * 129,
                                               "start": True}).encode()),
    Bad("session id empty", raw=json.dumps({"series": [[STEP]], "session": "",
                                            "start": True}).encode()),
    Bad("session id not a string", raw=json.dumps({"series": [[STEP]], "session": 5,
                                                   "start": True}).encode()),
    Bad("session start not a bool", raw=json.dumps({"series": [[STEP]], "session": "s",
                                                    "start": "yes"}).encode()),
    Bad("session end not a bool", raw=json.dumps({"series": [[STEP]], "session": "s",
                                                  "start": True, "end": 1}).encode()),
    Bad("session with several series", raw=json.dumps({"series": [[STEP], [STEP]],
                                                       "session": "s", "start": True}).encode()),
    Bad("session never started", raw=json.dumps({"series": [[STEP]],
                                                 "session": "nobody"}).encode()),
    Bad("session flags without a session", raw=json.dumps({"series": [[STEP]],
                                                           "start": True}).encode()),
    Bad("session header too long", series=[[STEP]], headers={"x-session-id": "x" * 129},
        valid_for=("v2",)),  # OIP names its session in parameters, not the header
    Bad("oip sequence_id a float", oip=oip(STEP, shape=[1, 1, 3], datatype="FP32",
                                           name="features", parameters={"sequence_id": 1.5})),
    Bad("oip sequence_id negative", oip=oip(STEP, shape=[1, 1, 3], datatype="FP32",
                                            name="features", parameters={"sequence_id": -1})),
    Bad("oip sequence_start not a bool",
        oip=oip(STEP, shape=[1, 1, 3], datatype="FP32", name="features",
                parameters={"sequence_id": "s", "sequence_start": 1})),
    Bad("oip sequence with several series",
        oip=oip(STEP + STEP, shape=[2, 1, 3], datatype="FP32", name="features",
                parameters={"sequence_id": "s", "sequence_start": True})),
    Bad("oip sequence never started", oip=oip(STEP, shape=[1, 1, 3], datatype="FP32",
                                              name="features",
                                              parameters={"sequence_id": "nobody"})),
    Bad("oip features FP64", oip=oip([1.0, 2.0, 3.0], shape=[1, 1, 3], datatype="FP64",
                                     name="features")),
    Bad("oip features flat shape", oip=oip([1.0, 2.0, 3.0], shape=[3], datatype="FP32",
                                           name="features")),
    Bad("oip lengths beyond the steps",
        oip={"inputs": [oip(STEP, shape=[1, 1, 3], datatype="FP32", name="features")[
            "inputs"][0], oip([2], shape=[1], datatype="INT64", name="lengths")["inputs"][0]]}),
    Bad("oip lengths zero",
        oip={"inputs": [oip(STEP, shape=[1, 1, 3], datatype="FP32", name="features")[
            "inputs"][0], oip([0], shape=[1], datatype="INT64", name="lengths")["inputs"][0]]}),
    Bad("oip lengths count",
        oip={"inputs": [oip(STEP, shape=[1, 1, 3], datatype="FP32", name="features")[
            "inputs"][0], oip([1, 1], shape=[2], datatype="INT64", name="lengths")["inputs"][0]]}),
    # -- OIP shapes and values beyond int64 and float (numpy would wrap or overflow: a 500)
    Bad("oip shape product overflowing int64",  # np.prod wrapped it to 0 elements
        oip={"inputs": [_features([], [2**32, 2**32, 3])]}),
    Bad("oip lengths beyond int64", oip={"inputs": [_features(STEP, [1, 1, 3]),
                                                    _lengths([2**70])]}),
    Bad("oip lengths below int64", oip={"inputs": [_features(STEP, [1, 1, 3]),
                                                   _lengths([-(2**70)])]}),
    Bad("oip features a 400-digit integer", series=[[[10**400, 0.0, 1.0]]]),
    Bad("oip header length of 4400 digits", oip=oip(["one"]),
        headers={"inference-header-content-length": "1" * 4400}),
    Bad("oip binary shape product overflowing int64", **oip_binary(
        [{"name": "features", "datatype": "FP32", "shape": [2**32, 2**32, 3],
          "parameters": {"binary_data_size": 0}}])),
]
GOOD = {"v1": json.dumps({"texts": ["one two"], "beam_size": 1}).encode(),
        "kserve": json.dumps({"instances": ["one two"]}).encode(),
        "v2": json.dumps(oip(["one two"], parameters={"beam_size": 1})).encode()}
GOOD_SERIES = {"predict": json.dumps({"series": [[STEP, STEP]]}).encode(),
               "kserve": json.dumps({"instances": [[STEP, STEP]]}).encode(),
               "v2": json.dumps(oip([[STEP, STEP]], shape=[1, 2, 3], datatype="FP32",
                                    name="features")).encode()}
GOOD_NO_OPTIONS = {"v1": json.dumps({"texts": ["one two"]}).encode(),
                   "kserve": json.dumps({"instances": ["one two"]}).encode(),
                   "v2": json.dumps(oip(["one two"])).encode(),
                   "generate": json.dumps({"prompts": ["one two"], "max_new_tokens": 2}).encode(),
                   "v2generate": json.dumps({"text_input": "one two",
                                             "parameters": {"max_tokens": 2}}).encode(),
                   "v2generate_stream": json.dumps({"text_input": "one two",
                                                    "parameters": {"max_tokens": 2}}).encode(),
                   "score": json.dumps({"texts": ["one two"]}).encode(),
                   "tokenize": json.dumps({"model": MODELS["lm"], "prompt": "one two"}).encode(),
                   "chat": json.dumps({"model": CHAT_MODEL, "max_tokens": 2, "messages": [
                       {"role": "user", "content": "one two"}]}).encode()}


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 30 and len({c.name for c in CASES}) == len(CASES)


@pytest.fixture(scope="module", params=["uvicorn", "native"])
def server(request: pytest.FixtureRequest, tiny_full_repo: Path, tiny_lm_repo: Path,
           tiny_series_repo: Path, tiny_chat_repo: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server on each HTTP front (`--front`: uvicorn's protocol, the native one)."""
    import shutil

    if request.param == "native":
        pytest.importorskip("seqserve.service.server._front",
                            reason="the native front is not built (native/build.sh)")

    repo = tmp_path_factory.mktemp("bad-inputs") / "repo"
    shutil.copytree(tiny_full_repo, repo)
    shutil.copytree(tiny_lm_repo / "tiny-lm", repo / "tiny-lm")
    shutil.copytree(tiny_chat_repo / CHAT_MODEL, repo / CHAT_MODEL)
    shutil.copytree(tiny_series_repo / "tiny-series", repo / "tiny-series")
    settings = Settings(repo=repo, intra_op_threads=1, warmup=False, front=request.param,
                        max_queue_wait_s=30.0, **LIMITS)  # (a stalled CI box: no stray 429)
    with serve_in_thread(create_app(settings)) as url:
        yield url


def route(task: str, protocol: str, pinned: bool) -> str:
    if protocol in TOKENIZE:
        return "/tokenize"
    if protocol in CHAT:
        return "/v1/chat/completions"
    prefix = "v1" if protocol in (*LM_VERBS, "predict", "kserve") else protocol[:2]
    base = f"/{prefix}/models/{MODELS[task]}" + ("/versions/1" if pinned else "")
    if protocol == "kserve":
        return f"{base}:predict"
    if protocol in LM_VERBS:
        return f"{base}/{protocol}"
    if protocol in OIP_LM_VERBS:
        return f"{base}/{protocol[2:]}"
    if protocol == "predict":
        return f"{base}/predict"
    return f"{base}/{V1_VERB[task]}" if protocol == "v1" else f"{base}/infer"


@pytest.mark.parametrize(("task", "protocol", "pinned"), TABLE_ROUTES,
                         ids=[f"{t}-{p}{'-pinned' if v else ''}" for t, p, v in TABLE_ROUTES])
def test_every_bad_input_is_a_4xx_and_the_connection_stays_usable(
        server: str, task: str, protocol: str, pinned: bool) -> None:
    path = route(task, protocol, pinned)
    good = (GOOD if task == "translator" else GOOD_SERIES if task == "series"
            else GOOD_NO_OPTIONS)[protocol]
    conn = RawConnection(server, timeout=30)
    try:
        for case in CASES:
            if protocol in case.valid_for:
                continue
            headers = {"content-type": "application/json", **case.headers}
            status, head, body = conn.request("POST", path, case.body(protocol, task), headers)
            assert 400 <= status < 500, (case.name, path, status, body[:300])
            assert case.status in (None, status), (case.name, path, status, body[:300])
            error = json.loads(body)["error"]
            if protocol in CHAT:  # OpenAI's shape
                error = error["message"]
            assert isinstance(error, str) and error, (case.name, path)
            assert head.get("connection") != "close", (case.name, path, head)
            status, _, body = conn.request("POST", path, good,
                                           {"content-type": "application/json"})
            assert status == 200, (case.name, "then good", path, status, body[:300])
        status, _, _ = conn.request("GET", "/v2/health/ready")
        assert status == 200
    finally:
        conn.close()


@pytest.mark.parametrize(("task", "protocol", "pinned"), ROUTES[::2],
                         ids=[f"{t}-{p}" for t, p, _ in ROUTES[::2]])
def test_unknown_model_version_or_task_is_404(server: str, task: str, protocol: str,
                                              pinned: bool) -> None:
    path = route(task, protocol, pinned)
    other = next(m for t, m in MODELS.items() if t != task)
    wrong = [path.replace(MODELS[task], "no-such-model"),
             path.replace(f"models/{MODELS[task]}", f"models/{MODELS[task]}/versions/9"),
             path.replace(f"models/{MODELS[task]}", f"models/{MODELS[task]}/versions/x")]
    if protocol not in ("v2", "kserve"):  # a model of another task behind this task's verb
        wrong.append(path.replace(MODELS[task], other))
    good = (GOOD_SERIES if task == "series" else GOOD_NO_OPTIONS)[protocol]
    conn = RawConnection(server, timeout=30)
    try:
        for p in wrong:
            status, _, body = conn.request("POST", p, good,
                                           {"content-type": "application/json"})
            assert status == 404 and json.loads(body)["error"], (p, status, body)
    finally:
        conn.close()


def _raw_deflate(data: bytes) -> bytes:
    squeeze = zlib.compressobj(wbits=-15)
    return squeeze.compress(data) + squeeze.flush()


READABLE = [
    ("no content type", {}, bytes),
    ("charset utf-8", {"content-type": "application/json; charset=UTF-8"}, bytes),
    ("quoted charset", {"content-type": 'application/json;charset="utf-8"'}, bytes),
    ("json suffix", {"content-type": "application/vnd.api+json"}, bytes),
    ("identity", {"content-type": "application/json", "content-encoding": "identity"}, bytes),
    ("gzip", {"content-type": "application/json", "content-encoding": "gzip"}, gzip.compress),
    ("gzip, no content type", {"content-encoding": "gzip"}, gzip.compress),
    ("two gzip members", {"content-encoding": "gzip"},
     lambda b: gzip.compress(b[:5]) + gzip.compress(b[5:])),
    ("deflate", {"content-type": "application/json", "content-encoding": "deflate"},
     zlib.compress),
    ("raw deflate", {"content-type": "application/json", "content-encoding": "Deflate"},
     _raw_deflate),
]


@pytest.mark.parametrize(("task", "protocol", "pinned"), ROUTES[::2],
                         ids=[f"{t}-{p}" for t, p, _ in ROUTES[::2]])
def test_json_bodies_without_a_type_with_a_charset_or_compressed_are_read(
        server: str, task: str, protocol: str, pinned: bool) -> None:
    """What the server reads: each way of sending a good body gets the plain body's answer
    (OIP infer also takes application/octet-stream, tritonclient's type)."""
    path = route(task, protocol, pinned)
    good = (GOOD if task == "translator" else GOOD_SERIES if task == "series"
            else GOOD_NO_OPTIONS)[protocol]
    ways = list(READABLE)
    if path.endswith("/infer"):
        ways.append(("binary", {"content-type": "application/octet-stream"}, bytes))
    conn = RawConnection(server, timeout=30)
    try:
        status, _, plain = conn.request("POST", path, good, {"content-type": "application/json"})
        assert status == 200, (path, plain[:300])
        for name, headers, encode in ways:
            status, _, body = conn.request("POST", path, encode(good), headers)
            assert status == 200, (name, path, status, body[:300])
            if task != "lm":  # sampled: a new answer each time
                assert body == plain, (name, path, body[:300], plain[:300])
    finally:
        conn.close()
