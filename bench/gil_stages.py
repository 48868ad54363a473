"""Benchmark helper (not a test): an API process's GIL-held time by request stage, from py-spy.

Record each API process of a running server under load with py-spy's GIL mode (only the
thread holding the GIL is sampled: the Python work, and syscalls made with the GIL held;
ONNX Runtime's compute releases it), then file every sample under the stage of its deepest
frame that names one (docs/performance.md section 21):

    seqserve serve --repo REPO --port 8765 --grpc-port 0 &
    wrk -t2 -c64 -d15s -s translate.lua http://127.0.0.1:8765 &
    for p in $(pgrep -P $SERVER_PID); do
        py-spy record -p $p -d 10 -r 200 --gil --format raw --nonblocking -o gil-$p.txt &
    done
    python bench/gil_stages.py gil-*.txt

py-spy slows the server down (by about a third here): read the shares, not absolute times.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("socket write (uvloop writes with the GIL held)", ("OneWrite.write",)),
    ("Prometheus metrics", ("prometheus_client",)),
    ("access log", ("AccessLog",)),
    ("parse + validate JSON", ("_parse (seqserve/service/api/hot_path.py", "model_validate_json")),
    ("tokenize", ("encode_texts", "SentencePieceProcessor.Encode", "Tokenizer.encode")),
    ("detokenize + answer objects", ("Worker._translation", "Worker._hypothesis",
                                     "SentencePieceProcessor.Decode", "_decode_raw")),
    ("response JSON", ("send_answer", "responses.py")),
    ("admission and the request lifecycle", ("lifecycle.py",)),
    ("hand-off to lanes (Lanes.put)", ("Lanes.put",)),
    ("beam search and decode scheduler (the loop's thread)", ("LoopDriver._loop",)),
    ("lane threads' Python around the runtime", ("serve_jobs",)),
    ("HTTP protocol (httptools, uvicorn)", ("http_protocol.py", "httptools_impl.py")),
    ("ASGI app, middleware, routing", ("middleware.py", "hot_path.py", "app.py",
                                       "proxy_headers")),
    ("event loop itself", ("Runner.run",)),
]


def stage_of(stack: str) -> str:
    """The stage of the deepest frame of a `;`-joined py-spy stack that names one."""
    for frame in reversed(stack.split(";")):
        for name, keys in STAGES:
            if any(k in frame for k in keys):
                return name
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", type=Path, nargs="+", help="py-spy --format raw outputs")
    args = p.parse_args()
    total: collections.Counter[str] = collections.Counter()
    for path in args.files:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack:
                total[stage_of(stack)] += int(count)
    n = sum(total.values())
    print(f"{n} GIL-held samples in {len(args.files)} file(s)")
    for name, count in total.most_common():
        print(f"  {count / max(n, 1):6.1%}  {name}")


if __name__ == "__main__":
    main()
