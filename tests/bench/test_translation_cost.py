"""bench/translation_cost.py's plumbing on the tiny translator, without timing assertions: the
peers' batched search is costed by its graphs and the rest, and a real `seqserve serve` under
the C generator is costed by its threads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import translation_cost as tc
from bench.peers.servers import free_port

pytestmark = pytest.mark.timeout(150)
TEXTS = ["one two", "three", "four five six", "two one", "six"] * 4


def test_the_batched_search_is_costed_by_its_graphs(tiny_repo: Path) -> None:
    cost = tc.peer_cost(tiny_repo / "tiny-mt" / "1", TEXTS, batch=8, beam=3)
    assert cost["encoder_ms"] > 0 and cost["decoder_ms"] > 0 and cost["rest_ms"] > 0
    parts = cost["encoder_ms"] + cost["decoder_ms"] + cost["rest_ms"]
    assert parts == pytest.approx(cost["total_ms"])
    assert cost["row_steps"] >= 1  # at least one step of one row per translation


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_a_served_translation_is_costed_by_its_threads(tiny_repo: Path) -> None:
    cost = tc.served_cost(tiny_repo, "tiny-mt", TEXTS, seconds=1.5, warmup=0.5,
                          port=free_port(), connections=4)
    assert cost["errors"] == 0 and cost["translations_per_s"] > 0
    assert cost["main_threads_ms"] > 0 and cost["other_threads_ms"] > 0
    assert cost["total_ms"] == pytest.approx(cost["main_threads_ms"] + cost["other_threads_ms"])


def test_the_served_decode_loop_is_costed_by_its_parts(tiny_repo: Path) -> None:
    folder = tiny_repo / "tiny-mt" / "1"
    cost = tc.loop_cost(tiny_repo, folder, TEXTS, clients=4, beam=3)
    assert cost["steps"] >= 1 and cost["translations_per_step"] > 0
    assert cost["graphs_us_per_step"] > 0
    assert cost["update_us_per_step"] > 0 and cost["schedule_us_per_step"] > 0
    parts = (cost["graphs_us_per_step"] + cost["scheduler_us_per_step"]
             + cost["driver_us_per_step"])
    assert parts == pytest.approx(cost["total_us_per_step"])
    assert cost["scheduler_us_per_step"] == pytest.approx(
        cost["schedule_us_per_step"] + cost["update_us_per_step"] + cost["settle_us_per_step"])
    assert 0 <= cost["kernel_us_per_step"] <= cost["scheduler_us_per_step"]
    # the loop is left as it was: no timed wrapper stays on the scheduler or the kernel
    from seqserve.service.scheduling import beam_native, group
    assert type(beam_native._kernel).__name__ != "_Kernel"
    assert type(group._kernel).__name__ != "_Kernel"


def test_the_peers_search_counts_its_steps(tiny_repo: Path) -> None:
    cost = tc.peer_cost(tiny_repo / "tiny-mt" / "1", TEXTS, batch=8, beam=3)
    assert cost["steps"] >= 1
    assert cost["rest_us_per_step"] == pytest.approx(
        1e3 * cost["rest_ms"] * len(TEXTS) / cost["steps"])
