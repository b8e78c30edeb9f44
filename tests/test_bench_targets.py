"""benchmarks/targets.py reads issue 43's targets from what the harnesses write: the verdicts
and figures of files shaped as `benchmarks.run`, `benchmarks.inflight`, `benchmarks.step_cost`
and `benchmarks.deployment --json` write them (no benchmark runs here: the figures are made up,
the reading is real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import targets
from benchmarks.inflight_report import OURS


def _row(n: int, wall: float, **extra: float) -> dict:
    return {
        "n": n,
        "wall_s": wall,
        "rss_mb": 150,
        "rss_growth_mb": 10,
        "pg_connections": 20,
        **extra,
    }


def _write(var: Path, name: str, data: dict) -> None:
    (var / name).write_text(json.dumps(data))


@pytest.fixture
def var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(targets, "VAR", tmp_path)
    return tmp_path


def _issue_43(var: Path) -> dict[str, targets.Target]:
    return {t.text: t for t in targets.collect() if t.issue == 43}


def _one(found: dict[str, targets.Target], start: str) -> targets.Target:
    (hit,) = [t for text, t in found.items() if text.startswith(start)]
    return hit


def test_every_issue_43_target_is_named_even_with_no_files(var: Path) -> None:
    found = _issue_43(var)
    for _, start in (e for e in targets.EXPECTED if e[0] == 43):
        assert _one(found, start).verdict() == "not measured"


def test_deployment_worker_cpu_and_batch_with_the_baseline_beside(var: Path) -> None:
    side = {
        "commit": "b1",
        "one_run_s": 2.0,
        "batch": {"over_floor": 1.8, "worker_cpu_ms": 36.0, "over_one": 3.0, "wall_s": 6.0},
    }
    before = {
        "commit": "a0",
        "one_run_s": 2.0,
        "batch": {"over_floor": 5.0, "worker_cpu_ms": 100.0, "over_one": 6.4, "wall_s": 12.8},
    }
    _write(
        var,
        "bench-deployment.json",
        {
            "args": {"runs": 100},
            "results": {"a": [before], "b": [side]},
            "floor": [{"cpu_ms_per_run": 20.0}],
        },
    )
    found = _issue_43(var)
    cpu = _one(found, "worker CPU per run")
    assert cpu.verdict() == "met"
    assert "1.80x" in cpu.figures and "before (a0): 5.00x" in cpu.figures
    batch = _one(found, "deployment: 100 runs within 2.5x")
    assert batch.verdict() == "not met"
    assert "3.00x" in batch.figures and "6.40x" in batch.figures


def test_cpu_bound_against_no_durability_and_dbos_durability(var: Path) -> None:
    results = {
        "ours (engine in-process)": {"runs_per_s": 40.0, "cpu_ms_per_run": 20.0},
        targets.BARE_AGENT: {"runs_per_s": 45.0, "cpu_ms_per_run": 18.0},
        targets.AGENT_PEER: {"runs_per_s": 21.0, "cpu_ms_per_run": 60.0},
    }
    _write(var, "bench-engine.json", {"results": results})
    found = _issue_43(var)
    assert _one(found, "CPU-bound: ours/no durability").verdict() == "met"  # 0.89
    assert _one(found, f"CPU-bound: ours/{targets.AGENT_PEER}").verdict() == "not met"  # 1.90


def test_latency_bound_first_delta_and_peers_from_inflight(var: Path) -> None:
    streaming = {
        "results": {
            OURS: [
                _row(1, 2.0),
                _row(200, 2.8, first_delta_socket_p50_ms=120, first_delta_socket_max_ms=300),
            ],
            "LangGraph + PostgresSaver (thread pool)": [_row(1, 2.0), _row(200, 4.0)],
        }
    }
    sleeping = {
        OURS: [_row(1, 2.0), _row(200, 5.0), _row(1000, 3.9)],
        "LangGraph + PostgresSaver (thread pool)": [_row(1, 2.0), _row(200, 4.0)],
    }
    starts = [{"case": "PostgreSQL + Redis", "p50_ms": 46, "p99_ms": 170, "mean_ms": 50}]
    _write(
        var,
        "bench-inflight.json",
        {"results": sleeping, "streaming": streaming, "starts": starts},
    )
    found = _issue_43(var)
    assert _one(found, "streaming: N=200 within 1.5x").verdict() == "met"  # 1.4x
    assert _one(found, "sleeping: N=1000 within 2.0x").verdict() == "met"  # 1.95x
    assert _one(found, "streaming: N=200 runs/s ahead").verdict() == "met"  # 71 > 50
    assert _one(found, "sleeping: N=200 runs/s ahead").verdict() == "not met"  # 40 < 50
    assert _one(found, "first delta p50 one run at a time").verdict() == "met"
    inside = _one(found, "first delta p50 inside the streaming N=200 batch")
    assert inside.verdict() == "met" and "120 ms" in inside.figures


def test_step_cost_ratio_and_a_run_that_did_not_finish(var: Path) -> None:
    row = {"finished": True, "slices_median": 1}
    rows = [
        {**row, "calls": 20, "steps": 41, "engine_cpu_ms_per_step": 1.0},
        {**row, "calls": 400, "steps": 801, "engine_cpu_ms_per_step": 1.2},
    ]
    _write(var, "bench-step-cost.json", {"rows": rows, "growth": 1.2, "target": 1.3})
    assert _one(_issue_43(var), "engine's own CPU per step").verdict() == "met"
    rows[1] = {
        "calls": 400,
        "steps": 801,
        "finished": False,
        "steps_done": 674,
        "slices": 27,
    }
    _write(
        var,
        "bench-step-cost.json",
        {"rows": rows, "growth": None, "target": 1.3, "budget_s": 120, "slice_seconds": 5},
    )
    unfinished = _one(_issue_43(var), "engine's own CPU per step")
    assert unfinished.verdict() == "not met"
    assert "674 of 801 steps after 27 slices" in unfinished.figures
