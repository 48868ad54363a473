#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU and torch, serve the demo classifier with the
# TorchScript runtime on CUDA (parity vs CPU, throughput at batch 1/64/256, HTTP round trip),
# then run the translator decoding engine on CUDA (tokens identical to CPU, tokens/s at
# 1/32/256 concurrent requests).
#
# Needs: model_repository/ with the demo bundles (make run), data/langid and
# data/numbers-en-fr test splits, python3 with torch (CUDA), numpy, sentencepiece,
# onnxruntime, prometheus-client, fastapi, uvicorn, pydantic-settings, httpx.
#   bash deploy/gpu-check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu_check_results}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
echo "== classifier: TorchScript on CUDA"
"$PY" deploy/gpu_check.py --repo model_repository --model langid \
    --data data/langid/test.jsonl --json "$OUT/classifier.json" 2>&1 | tee "$OUT/classifier.log"
echo "== translator: decoding engine with TorchScript on CUDA"
"$PY" bench/bench_translate.py --gpu-check --repo model_repository --model numbers-en-fr \
    --data data/numbers-en-fr --sentences 512 --json "$OUT/translator.json" 2>&1 \
    | tee "$OUT/translator.log"
