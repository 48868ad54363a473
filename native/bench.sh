#!/bin/sh
# Native front (+ asyncio driver) vs. uvicorn/httptools on the same echo JSON, one process
# each, wrk -c64 -t2 -d5s.  Prints req/s and server CPU seconds per request (utime+stime
# from /proc/PID/stat).   native/bench.sh PYTHON
set -eu
py=${1:-python3}
cd "$(dirname "$0")/.."
clk=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
run() {
    name=$1; port=$2; shift 2
    PYTHONPATH=. "$py" "$@" >/dev/null 2>&1 &
    pid=$!
    sleep 2
    curl -s -o /dev/null "http://127.0.0.1:$port/echo" || { echo "$name did not start"; kill $pid; return; }
    c0=$(cpu $pid)
    out=$(wrk -t2 -c64 -d5s "http://127.0.0.1:$port/echo")
    c1=$(cpu $pid)
    kill $pid; wait $pid 2>/dev/null || true
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    lat=$(echo "$out" | awk '/Latency/ {print $2}')
    echo "$name: $rps req/s, $n requests, mean latency $lat, server cpu $(echo "$c0 $c1 $clk $n" | awk '{printf "%.1f us/request (%.2f s)", ($2-$1)/$3/$4*1e6, ($2-$1)/$3}')"
}
run native 18941 native/echo_front.py 18941 1
run uvicorn 18942 native/bench_uvicorn_echo.py 18942
