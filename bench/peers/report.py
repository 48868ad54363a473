"""The printed table of a peers run (markdown, ready for docs/performance.md)."""

from __future__ import annotations

from typing import Any

PEERS = ("mosec", "torchserve", "fastapi per request")


def render(res: dict[str, Any]) -> str:
    names = list(res["texts"])
    lines = [_header(res), "", *_table(res, names), "", *_ratios(res, names),
             *_client(res, names), *_skipped(res)]
    return "\n".join(lines)


def _header(res: dict[str, Any]) -> str:
    t = res["texts"]
    shapes = {"short": "two number phrases", "long": "10-60 words, cut at 256 tokens"}
    texts = "; ".join(f"{n}: {shapes.get(n, n)}, mean {v['mean_tokens']} tokens "
                      f"(min {v['min_tokens']}, max {v['max_tokens']})" for n, v in t.items())
    rounds = len(res.get("rounds", [])) or 1
    per = (f" {rounds} rounds, servers in reversed order every other round; req/s of the "
           "median round (every round's in brackets), its p50/p99." if rounds > 1 else "")
    return (f"{res['started']} UTC, {res['cores']} cores, load average {res['loadavg_start']:.2f}"
            f" at start, {res['loadavg_end']:.2f} at end. Model {res['model']} "
            f"({res['bundle']}). Closed loop, {res['connections']} keep-alive connections, one "
            f"new text per request, {res['duration_s']:g} s per server and workload after "
            f"{res['warmup_s']:g} s of warm-up, client {res['client']}.{per} Texts: {texts}.")


def _table(res: dict[str, Any], names: list[str]) -> list[str]:
    cols = [f"{n} {c}" for n in names for c in ("req/s", "p50 ms", "p99 ms", "err")]
    out = ["| server | " + " | ".join(cols) + " | answers | load avg | config |",
           "| --- | " + " | ".join("---:" for _ in cols) + " | ---: | ---: | --- |"]
    for s in res["servers"]:
        cells = []
        for n in names:
            r = s.get(n)
            if r is None:
                cells += ["-"] * 4
                continue
            err = sum(r["errors"].values())
            rps = f"{r['rps']:.0f}"
            if len(r.get("rps_rounds", [])) > 1:
                rps += " (" + ", ".join(f"{x:.0f}" for x in r["rps_rounds"]) + ")"
            cells += [rps, f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", str(err)]
        ans = s.get("answers")
        answers = f"{ans['matched']}/{ans['checked']}" if ans else "-"
        loads = [s[n][k] for n in names if n in s for k in ("loadavg_start", "loadavg_end")]
        load = f"{min(loads):.2f}-{max(loads):.2f}" if loads else "-"
        name = s["name"] if "skipped" not in s else f"{s['name']} (not measured)"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {answers} | {load} | {s['config']} |")
    ceil = []
    for n in names:
        best = res["ceiling"][n]["best"]
        ceil += [f"{best['seq_s']:.0f}", "", "", ""]
    how = ", ".join(f"{n}: batch {res['ceiling'][n]['best']['batch']} "
                    f"{res['ceiling'][n]['best']['order']}, "
                    f"{res['ceiling'][n]['best']['threads']} thread(s)" for n in names)
    out.append("| bare ONNX Runtime (seq/s, ceiling) | " + " | ".join(ceil)
               + f" | | | best of batch x threads x order ({how}) |")
    return out


def _measured(res: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [s for s in res["servers"] if name in s and "skipped" not in s]


def _ratios(res: dict[str, Any], names: list[str]) -> list[str]:
    out = []
    for n in names:
        runs = _measured(res, n)
        peers = [s for s in runs if s["name"] in PEERS]
        ours = [s for s in runs if s["name"] not in PEERS]
        ceiling = res["ceiling"][n]["best"]["seq_s"]
        best = max(peers, key=lambda s: s[n]["rps"]) if peers else None
        for s in ours:
            r = s[n]
            parts = [f"{s['name']} / ceiling = {r['rps'] / ceiling:.2f}"]
            if best is not None:
                b = best[n]
                parts.insert(0, f"{s['name']} / best peer ({best['name']}, {b['rps']:.0f} "
                             f"req/s) = {r['rps'] / b['rps']:.2f}x, p99 {r['p99_ms']:.0f} vs "
                             f"{b['p99_ms']:.0f} ms")
            per_round = _round_ratios(res, n, s["name"])
            if len(per_round) > 1:
                parts.append("per round vs that round's best peer: "
                             + ", ".join(f"{x:.2f}x" for x in per_round))
            out.append(f"- {n}: " + "; ".join(parts))
        out.append(f"- {n}: ceiling points (seq/s): " + _points(res["ceiling"][n]["points"]))
    return out


def _round_ratios(res: dict[str, Any], n: str, ours: str) -> list[float]:
    """Within each round: our req/s over the best peer's req/s of the same round."""
    out = []
    for rnd in res.get("rounds", []):
        peers = [r[n]["rps"] for name, r in rnd.items() if name in PEERS and n in r]
        if ours in rnd and n in rnd[ours] and peers:
            out.append(rnd[ours][n]["rps"] / max(peers))
    return out


def _points(points: list[dict[str, Any]]) -> str:
    return ", ".join(f"{p['order'][0]}{p['batch']}/{p['threads']}t {p['seq_s']:.0f}"
                     for p in points) + " (a = arrival order, s = sorted by length; b/threads)"


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
