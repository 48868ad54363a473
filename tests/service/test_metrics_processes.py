"""Multiprocess metrics with the cached pid (`core.metrics.cached_pid`): each process still
writes its own samples, also a process forked after its metrics were made, and `/metrics`
sums them. Run in a fresh interpreter, since prometheus-client picks its value class from
PROMETHEUS_MULTIPROC_DIR when first imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SCRIPT = textwrap.dedent("""
    import os, sys
    from prometheus_client import values
    from seqserve.service.core import metrics as m

    assert values.ValueClass is not values.MutexValue  # multiprocess values
    registry = m.Metrics()
    requests = registry.requests.labels("clf", "classify", "200")
    requests.inc(2)
    child = os.fork()
    if child == 0:  # the child's samples go to its own file, starting from zero
        assert m.cached_pid() == os.getpid()
        requests.inc(3)
        os._exit(0)
    os.waitpid(child, 0)
    assert m.cached_pid() == os.getpid() != child
    requests.inc(4)
    files = sorted(p for p in os.listdir(sys.argv[1]) if p.startswith("counter_"))
    print(" ".join(files))
    print(registry.exposition()[0].decode())
""")


def test_every_process_writes_its_own_samples_with_the_cached_pid(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
                                                     "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    files = out.stdout.splitlines()[0].split()
    assert len(files) == 2, files  # the parent's and the forked child's
    samples = text_string_to_metric_families(out.stdout.split("\n", 1)[1])
    total = [s.value for f in samples if f.name == "seqserve_requests" for s in f.samples
             if s.name == "seqserve_requests_total" and s.labels["model"] == "clf"]
    assert total == [2 + 3 + 4]  # the parent's 2 and 4, the child's 3 (not 2 + 3)
