"""Human-readable summaries of a bundle and of a parity report (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqserve.export.manifest import Manifest


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def format_parity(report: dict[str, Any]) -> list[str]:
    """Lines with the maxima of a parity report (see export.parity)."""
    if not report:
        return ["parity: (no report)"]
    grid = report.get("grid", {})
    tol = report.get("tolerances", {})
    lines = [f"parity vs {report.get('reference')} over {grid.get('batches')} batches "
             f"(batch sizes {grid.get('batch_sizes')}, lengths {grid.get('lengths')}); "
             f"bounds {tol.get('parity')} / invariance {tol.get('invariance')}; "
             f"{report.get('seconds')} s"]
    invariance = "max |row in batch - row alone| / max(1, |row alone|)"
    for title, key in (("max |format - reference|", "parity_max_abs"),
                       (invariance, "invariance_max_diff")):
        table: dict[str, dict[str, float]] = report.get(key, {})
        if table:
            lines.append(f"  {title}:")
        for fmt, row in table.items():
            cells = ", ".join(f"{k} {v:.2e}" for k, v in row.items())
            lines.append(f"    {fmt:<12} {cells}")
    mism = report.get("topk_id_mismatches") or {}
    if mism:
        lines.append(f"  top-k id mismatches {mism}, tie swaps {report.get('topk_tie_swaps')}")
    if report.get("k_dynamic"):
        lines.append(f"  dynamic k (k=1 vs k=5 on one graph): {report['k_dynamic']}")
    lines.append("  PASSED" if report.get("passed") else
                 "  FAILED:\n    " + "\n    ".join(report.get("failures", [])))
    return lines


def format_summary(bundle: Path, manifest: Manifest, seconds: float | None = None) -> str:
    """Files with sizes, graphs, and parity figures of a written bundle."""
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    decoder = f", decoder {manifest.decoder}" if manifest.decoder else ""
    lines = [f"bundle {bundle} ({manifest.task} {manifest.name} v{manifest.version}{decoder}, "
             f"opset {manifest.opset}){took}"]
    for name in sorted(p.name for p in bundle.iterdir()):
        lines.append(f"  {name:<22} {_size((bundle / name).stat().st_size):>10}")
    lines += format_parity(manifest.parity)
    return "\n".join(lines)
