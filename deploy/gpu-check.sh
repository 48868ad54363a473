#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU and torch, serve the demo classifier with the
# TorchScript runtime on CUDA (parity vs CPU, throughput at batch 1/64/256, HTTP round trip),
# then run the translator decoding engine on CUDA (tokens identical to CPU, tokens/s at
# 1/32/256 concurrent requests, and the same on the machine's CPU cores), then served classify
# requests/s against the number of API processes (1, 2, 4, 8; four load generators at once, so
# the generator is not the limit).
#
# Needs: model_repository/ with the demo bundles (make run), data/langid and
# data/numbers-en-fr test splits, python3 with torch (CUDA), numpy, sentencepiece,
# onnxruntime, prometheus-client, fastapi, uvicorn, pydantic-settings, httpx, pyzmq, msgspec.
# The server runs as users run it: a supervisor, API processes and one engine process
# (--api-workers/--instances auto: chosen for the machine and printed in serve.log).
#   bash deploy/gpu-check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu_check_results}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
DEVICE="${DEVICE:-cuda}"
PORT="${PORT:-8431}"
SECTIONS="${SECTIONS:-classifier translator http sweep}"  # a subset: SECTIONS="translator sweep"
on() { case " $SECTIONS " in *" $1 "*) return 0;; *) return 1;; esac; }
if on classifier; then
echo "== classifier: TorchScript on CUDA"
"$PY" deploy/gpu_check.py --repo model_repository --model langid \
    --data data/langid/test.jsonl --json "$OUT/classifier.json" 2>&1 | tee "$OUT/classifier.log"
fi
if on translator; then
echo "== translator: decoding engine with TorchScript on CUDA"
"$PY" bench/bench_translate.py --gpu-check --repo model_repository --model numbers-en-fr \
    --data data/numbers-en-fr --sentences "${SENTENCES:-512}" --json "$OUT/translator.json" \
    2>&1 | tee "$OUT/translator.log"
fi
if on http; then
echo "== HTTP under load: seqserve serve (TorchScript on CUDA) and seqserve loadtest as separate processes"
"$PY" -m seqserve.cli serve --repo model_repository --runtime torchscript --device "$DEVICE" \
    --port "$PORT" --max-batch-size 64 --log-level warning --no-grpc > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/v2/health/ready')" \
        2>/dev/null && break
    sleep 1
done
for spec in "langid classify data/langid/test.jsonl 1" \
            "langid classify data/langid/test.jsonl 32" \
            "numbers-en-fr translate data/numbers-en-fr/test.jsonl 1"; do
    set -- $spec
    "$PY" -m seqserve.cli loadtest "http://127.0.0.1:$PORT" --model "$1" --task "$2" \
        --texts "$3" --texts-per-request "$4" --concurrency 64 --duration 10 \
        --out "$OUT/load_$1_$4" --no-plots --quiet 2>&1 | tee "$OUT/load_$1_$4.log"
done
kill -TERM "$SERVER"; wait "$SERVER" || true
trap - EXIT
fi
on sweep || exit 0

echo "== served classify requests/s against API processes (TorchScript on $DEVICE)"
: > "$OUT/api_sweep.txt"
for W in ${API_SWEEP:-1 2 4 8}; do
    "$PY" -m seqserve.cli serve --repo model_repository --runtime torchscript --device "$DEVICE" \
        --port "$PORT" --api-workers "$W" --max-batch-size 64 --log-level warning --no-grpc \
        > "$OUT/serve_w$W.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 300); do
        "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/v2/health/ready')" \
            2>/dev/null && break
        sleep 1
    done
    for g in 1 2 3 4; do
        "$PY" -m seqserve.cli loadtest "http://127.0.0.1:$PORT" --model langid --task classify \
            --texts data/langid/test.jsonl --concurrency 64 --duration 10 --seed "$g" \
            --out "$OUT/sweep_w${W}_g$g" --no-plots --quiet > "$OUT/sweep_w${W}_g$g.log" 2>&1 &
    done
    wait $(jobs -p | grep -v "^$SERVER$") 2>/dev/null || true
    "$PY" - "$OUT" "$W" >> "$OUT/api_sweep.txt" <<'PYEOF'
import json, sys
from pathlib import Path
out, w = Path(sys.argv[1]), sys.argv[2]
steps = [json.loads((out / f"sweep_w{w}_g{g}" / "results.json").read_text())["steps"][0]
         for g in (1, 2, 3, 4) if (out / f"sweep_w{w}_g{g}" / "results.json").exists()]
rps = sum(s["throughput_rps"] for s in steps)
p99 = max(((s.get("latency_ms") or {}).get("p99", 0) for s in steps), default=0)
errors = sum(s["errors"] + s["dropped"] for s in steps)
print(f"api_workers={w} generators={len(steps)} req/s={rps:.0f} "
      f"worst_generator_p99_ms={p99:.1f} errors_and_drops={errors}")
PYEOF
    tail -1 "$OUT/api_sweep.txt"
    kill -TERM "$SERVER"; wait "$SERVER" || true
done
