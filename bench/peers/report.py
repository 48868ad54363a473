"""The printed tables of a peers run (markdown, ready for docs/performance.md).

Per workload: seqserve, then each peer at its best setting for that workload (highest req/s
among its settings), with CPU per request, then the bare runtime (its ceiling in seq/s and its
compute-only floor in CPU ms per sequence). Then every setting's row, and the ratios.
"""

from __future__ import annotations

from typing import Any

SHAPES = {"short": "two number phrases", "long": "10-60 words, cut at 256 tokens",
          "translate": "numbers-en-fr English sources, beam 5"}


def render(res: dict[str, Any]) -> str:
    names = list(res["texts"])
    lines = [_header(res)]
    for n in names:
        lines += ["", f"**{n}**", "", *_table(res, n)]
    lines += ["", *_ratios(res, names), *_client(res, names), *_skipped(res),
              "", "Every setting (raw results keep every round):", "", *_all(res, names)]
    return "\n".join(lines)


def _header(res: dict[str, Any]) -> str:
    t = res["texts"]
    texts = "; ".join(f"{n}: {SHAPES.get(n, n)}, mean {v['mean_tokens']} tokens "
                      f"(min {v['min_tokens']}, max {v['max_tokens']})" for n, v in t.items())
    rounds = len(res.get("rounds", [])) or 1
    per = (f" {rounds} rounds, servers in reversed order every other round; req/s of the "
           "median round (every round's in brackets), its p50/p99." if rounds > 1 else "")
    bundles = ", ".join(res.get("bundles", {}).values()) or res["bundle"]
    return (f"{res['started']} UTC, {res['cores']} cores, load average {res['loadavg_start']:.2f}"
            f" at start, {res['loadavg_end']:.2f} at end. Bundles {bundles}. Closed loop, "
            f"{res['connections']} keep-alive connections, one new text per request, "
            f"{res['duration_s']:g} s per server and workload after {res['warmup_s']:g} s of "
            f"warm-up, client {res['client']}.{per} CPU ms/request: user + system time of all "
            f"the server's processes over the measured window (/proc), over its requests. "
            f"Texts: {texts}.")


def _measured(res: dict[str, Any], n: str) -> list[dict[str, Any]]:
    return [s for s in res["servers"] if n in s and "skipped" not in s]


def ours(res: dict[str, Any], n: str) -> list[dict[str, Any]]:
    """seqserve's rows (no peer) measured on workload n."""
    return [s for s in _measured(res, n) if not s.get("peer")]


def best_peers(res: dict[str, Any], n: str) -> dict[str, dict[str, Any] | None]:
    """Each peer that serves workload n -> its setting with the highest req/s (None: no
    setting of it was measured)."""
    out: dict[str, dict[str, Any] | None] = {}
    for s in res["servers"]:
        peer = s.get("peer")
        if not peer or n not in s.get("workloads", [n]):
            continue
        out.setdefault(peer, None)
        if n in s and "skipped" not in s:
            cur = out[peer]
            if cur is None or s[n]["rps"] > cur[n]["rps"]:
                out[peer] = s
    return out


def _tokens(res: dict[str, Any], n: str) -> float | None:
    ref = res["ceiling"].get(n, {})
    return ref.get("mean_out_tokens") if n == "translate" else None


def _row(res: dict[str, Any], s: dict[str, Any], n: str, name: str) -> str:
    r = s[n]
    err = sum(r["errors"].values())
    rps = f"{r['rps']:.0f}"
    if len(r.get("rps_rounds", [])) > 1:
        rps += " (" + ", ".join(f"{x:.0f}" for x in r["rps_rounds"]) + ")"
    per = _tokens(res, n)
    tok = [f"{r['rps'] * per:.0f}"] if per is not None else []
    ans = s.get("answers")
    answers = f"{ans['matched']}/{ans['checked']}" if ans else "-"
    load = f"{r['loadavg_start']:.2f}-{r['loadavg_end']:.2f}"
    cells = [name, s.get("setting") or "-", rps, *tok, f"{r['p50_ms']:.1f}",
             f"{r['p99_ms']:.1f}", f"{r['cpu_ms_per_request']:.3f}", str(err), answers, load,
             s["config"]]
    return "| " + " | ".join(cells) + " |"


def _table(res: dict[str, Any], n: str) -> list[str]:
    tok = n == "translate"
    cols = ["server", "best setting", "req/s", *(["tokens/s"] if tok else []), "p50 ms",
            "p99 ms", "CPU ms/request", "err", "answers", "load avg", "config"]
    out = ["| " + " | ".join(cols) + " |",
           "| --- | --- | " + " | ".join("---:" for _ in cols[2:-1]) + " | --- |"]
    for s in ours(res, n):
        out.append(_row(res, s, n, s["name"]))
    for peer, s in best_peers(res, n).items():
        if s is None:
            out.append(f"| {peer} (not measured) |" + " |" * (len(cols) - 1))
        else:
            out.append(_row(res, s, n, peer))
    ceil = res["ceiling"].get(n)
    if ceil and "best" in ceil:
        best, floor = ceil["best"], ceil["floor"]
        blank = [""] * 2
        out.append(f"| bare ONNX Runtime: ceiling (seq/s) | batch {best['batch']} "
                   f"{best['order']}, {best['threads']} thread(s) | {best['seq_s']:.0f} | "
                   + " | ".join(blank) + f" | {best['cpu_ms']:.3f} | | | | no HTTP |")
        out.append(f"| bare ONNX Runtime: compute-only floor | batch {floor['batch']} "
                   f"{floor['order']}, {floor['threads']} thread(s) | {floor['seq_s']:.0f} | "
                   + " | ".join(blank) + f" | **{floor['cpu_ms']:.3f}** | | | | least CPU "
                   "per sequence over batch x threads x order |")
    elif ceil:
        out.append(f"| reference beam search in process | 1 text at a time, 1 thread | "
                   f"{ceil['texts_s']:.0f} | {ceil['tokens_s']:.0f} | | | {ceil['cpu_ms']:.3f} "
                   f"| | | | no HTTP; {ceil['mean_out_tokens']} tokens per text |")
    return out


def _ratios(res: dict[str, Any], names: list[str]) -> list[str]:
    out = []
    for n in names:
        peers = [s for s in best_peers(res, n).values() if s is not None]
        best = max(peers, key=lambda s: s[n]["rps"]) if peers else None
        ceil = res["ceiling"].get(n, {})
        for s in ours(res, n):
            r = s[n]
            parts = []
            if best is not None:
                b = best[n]
                what = "tokens/s" if n == "translate" else "req/s"
                parts.append(f"{s['name']} / best peer ({best['name']}, {b['rps']:.0f} req/s) "
                             f"= {r['rps'] / b['rps']:.2f}x {what}, p99 {r['p99_ms']:.0f} vs "
                             f"{b['p99_ms']:.0f} ms, CPU {r['cpu_ms_per_request']:.3f} vs "
                             f"{b['cpu_ms_per_request']:.3f} ms/request")
            if "best" in ceil:
                parts.append(f"{s['name']} / ceiling = {r['rps'] / ceil['best']['seq_s']:.2f}")
                parts.append(f"CPU per request minus the floor = "
                             f"{r['cpu_ms_per_request'] - ceil['floor']['cpu_ms']:.3f} ms")
            per_round = _round_ratios(res, n, s["name"])
            if len(per_round) > 1:
                parts.append("per round vs that round's best peer: "
                             + ", ".join(f"{x:.2f}x" for x in per_round))
            out.append(f"- {n}: " + "; ".join(parts))
        if "points" in ceil:
            out.append(f"- {n}: ceiling points (seq/s, CPU ms/seq): " + _points(ceil["points"]))
    return out


def _round_ratios(res: dict[str, Any], n: str, name: str) -> list[float]:
    """Within each round: our req/s over the best peer setting's req/s of the same round."""
    out = []
    for rnd in res.get("rounds", []):
        peers = [r[n]["rps"] for r in rnd.values() if r.get("peer") and n in r]
        mine = [r[n]["rps"] for r in rnd.values() if r["name"] == name and n in r]
        if mine and peers:
            out.append(mine[0] / max(peers))
    return out


def _points(points: list[dict[str, Any]]) -> str:
    return ", ".join(f"{p['order'][0]}{p['batch']}/{p['threads']}t {p['seq_s']:.0f} "
                     f"{p['cpu_ms']:.3f}" for p in points) + \
        " (a = arrival order, s = sorted by length; batch/threads)"


def _all(res: dict[str, Any], names: list[str]) -> list[str]:
    out = ["| server | workload | req/s | p99 ms | CPU ms/request | processes | err |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for s in res["servers"]:
        if "skipped" in s:
            out.append(f"| {s['name']} | not measured | | | | | |")
            continue
        for n in names:
            if n in s:
                r = s[n]
                out.append(f"| {s['name']} | {n} | {r['rps']:.0f} | {r['p99_ms']:.1f} | "
                           f"{r['cpu_ms_per_request']:.3f} | {s.get('processes', '-')} | "
                           f"{sum(r['errors'].values())} |")
    return out


def _client(res: dict[str, Any], names: list[str]) -> list[str]:
    check = res.get("client_ceiling")
    if not check:
        return []
    parts = []
    for client, per in check.items():
        parts.append(f"{client} " + ", ".join(f"{n} {per[n]['rps']:.0f} req/s (p99 "
                                              f"{per[n]['p99_ms']:.1f} ms)"
                                              for n in names if n in per))
    return ["- load tool's own ceiling, against a trivial server on the same cores: "
            + "; ".join(parts)]


def _skipped(res: dict[str, Any]) -> list[str]:
    return [f"- {s['name']} not measured: {s['skipped']}" for s in res["servers"]
            if "skipped" in s]
