"""The last step of `make bench`: every target of issues 22, 21 and 32, "met" or "not met" with its
figures, from what this run's harnesses wrote (var/bench-engine.json by `benchmarks.run`,
var/bench-inflight.json by `benchmarks.inflight`, var/bench-pydantic-ai.json by
`benchmarks.pydantic_ai_flow --json`), so every figure comes from the same `make bench`.

    .venv/bin/python -m benchmarks.targets [--write-docs]

A missing file or row is reported as "not measured" (never as met). No Django: it only reads.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

from benchmarks.docs import write_marked_section
from benchmarks.inflight_report import OURS, row_at

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
# the cluster's processes besides its workers: qcluster's main process (the sweeper loop and
# the outbox's deliveries), q2's sentinel, pusher and monitor; each has a pool of its own
AUX_PROCESSES = 4
FLAT_PER_STEP = 1.25  # "flat": a 1001-step run's cost per step within 1.25x an 11-step run's
SYNC_PEERS = ("DBOS Transact", "LangGraph + PostgresSaver")  # the async LangGraph is reference only
AGENT_PEER = (
    "Pydantic AI agent + DBOSDurability"  # the same agent as ours (benchmarks/peers_agent.py)
)


@dataclass
class Target:
    issue: int
    text: str
    met: bool | None  # None: not measured in this run
    figures: str
    reported: bool = False  # a figure the issue asks for, with no bound to meet

    def verdict(self) -> str:
        if self.reported and self.met is not None:
            return "reported"
        return "not measured" if self.met is None else "met" if self.met else "not met"


def _load(name: str) -> dict:
    path = VAR / name
    return json.loads(path.read_text()) if path.exists() else {}


def _latency_targets(
    issue: int, label: str, side: dict, n: int, within: float, peers_too: bool = True
) -> list[Target]:
    results = side.get("results") or {}
    ours = results.get(OURS) or []
    one, top = row_at(ours, 1), row_at(ours, n)
    if not (one and top):
        return [Target(issue, f"{label}: N={n} within {within}x one run", None, "no figures")]
    ratio = top["wall_s"] / one["wall_s"]
    found = [
        Target(
            issue,
            f"{label}: N={n} within {within}x one run",
            ratio <= within,
            f"{ratio:.2f}x ({top['wall_s']:.2f} s against {one['wall_s']:.2f} s)",
        )
    ]
    if peers_too:
        rates = {
            name: row_at(rows, n)["n"] / row_at(rows, n)["wall_s"]
            for name, rows in results.items()
            if name != OURS and row_at(rows, n)
        }
        ours_rate = n / top["wall_s"]
        if rates:
            best = max(rates, key=rates.get)
            others = ", ".join(f"{k} {v:.1f}" for k, v in rates.items())
            found.append(
                Target(
                    issue,
                    f"{label}: N={n} runs/s at least the fastest peer's",
                    ours_rate >= rates[best],
                    f"ours {ours_rate:.1f} runs/s, {others} (ours/fastest {ours_rate / rates[best]:.2f})",
                )
            )
        else:
            found.append(Target(issue, f"{label}: N={n} runs/s vs peers", None, "no peer ran"))
    return found


def _start_latency(issue: int, inflight: dict, bound_ms: float) -> Target:
    redis = next((r for r in inflight.get("starts") or [] if "Redis" in r["case"]), None)
    probe = row_at((inflight.get("streaming") or {}).get("results", {}).get(OURS, []), 200)
    text = f"start to first streamed delta p50 on PostgreSQL + Redis under {bound_ms:.0f} ms"
    if not redis:
        return Target(issue, text, None, "no figures")
    figures = f"p50 {redis['p50_ms']:.0f} ms, p99 {redis['p99_ms']:.0f} ms (one run at a time)"
    if probe and probe.get("first_delta_socket_p50_ms") is not None:
        figures += (
            f"; during the streaming N=200 batch p50 {probe['first_delta_socket_p50_ms']:.0f} ms"
        )
    return Target(issue, text, redis["p50_ms"] < bound_ms, figures)


def connection_bound(cfg: dict) -> tuple[int, str]:
    """The most PostgreSQL connections the cluster can hold, from the code and the settings the
    bench ran with: every process's psycopg pool (DB_POOL_MAX_SIZE; a pool never opens more),
    plus the connections outside the pools: each worker process's claimer LISTENs on one of its
    own (runtime/workers/claimer.py, when claims are on) and q2's pusher one for the doorbell
    broker (runtime/dispatch/broker.py), both through `dispatch/connections.open_listener`,
    which opens a new one only after the old one is closed."""
    workers, pool_max = cfg["q_workers"], cfg["pool_max"]
    claimers = cfg.get("claimer_listeners", 1)  # per worker process (an older file: claims on)
    doorbell = cfg.get("doorbell_listeners", 1)
    bound = workers * (pool_max + claimers) + AUX_PROCESSES * pool_max + doorbell
    formula = (
        f"{workers} worker processes x ({pool_max} pool + {claimers} claimer LISTEN) + "
        f"{AUX_PROCESSES} other q2 processes x {pool_max} pool + {doorbell} doorbell LISTEN"
    )
    return bound, formula


def collect() -> list[Target]:
    engine, inflight, pa = _load("bench-engine.json"), _load("bench-inflight.json"), None
    pa = _load("bench-pydantic-ai.json")
    found: list[Target] = []
    sleeping = {"results": inflight.get("results") or {}}
    streaming = inflight.get("streaming") or {}

    # ---- issue 22
    found += _latency_targets(22, "sleeping", sleeping, 200, 1.5)
    found += _latency_targets(22, "streaming", streaming, 200, 1.5)
    found += _latency_targets(22, "sleeping", sleeping, 1000, 2.0, peers_too=False)
    top = row_at(sleeping["results"].get(OURS, []), 1000)
    cfg = inflight.get("config")
    if top and cfg:
        found.append(
            Target(
                22,
                "sleeping: N=1000 RSS growth at most 300 MB per process",
                top["rss_growth_mb"] <= 300,
                f"+{top['rss_growth_mb']:.0f} MB (largest worker process, peak {top['rss_mb']:.0f} MB)",
            )
        )
        bound, formula = connection_bound(cfg)
        found.append(
            Target(
                22,
                "sleeping: N=1000 PostgreSQL connections bounded by the pools",
                top["pg_connections"] <= bound,
                f"peak {top['pg_connections']}; bound {formula} = {bound}",
            )
        )
    else:
        found.append(Target(22, "sleeping: N=1000 RSS and connections", None, "no figures"))
    found.append(_start_latency(22, inflight, 50))
    results = engine.get("results") or {}
    ours = (results.get("ours (engine in-process)") or {}).get("runs_per_s")
    floor = (results.get("floor (raw psycopg)") or {}).get("runs_per_s")
    peers = {n: results[n]["runs_per_s"] for n in SYNC_PEERS if n in results}
    if ours and floor:
        found.append(
            Target(
                22,
                "CPU-bound: ours/floor at least 0.6",
                ours / floor >= 0.6,
                f"{ours / floor:.2f} ({ours:.1f} against {floor:.1f} runs/s)",
            )
        )
    if ours and peers:
        best = max(peers, key=peers.get)
        found.append(
            Target(
                22,
                "CPU-bound: ours/fastest peer at least 2.5",
                ours / peers[best] >= 2.5,
                f"{ours / peers[best]:.2f} against {best} ({peers[best]:.1f} runs/s)",
            )
        )
    rec = engine.get("recovery")
    if rec:
        found.append(
            Target(
                22,
                "SIGKILL recovery bound unchanged (p99 under lease TTL + sweep + 1 s)",
                rec["p99_s"] <= rec["bound_s"],
                f"p99 {rec['p99_s']:.2f} s, max {rec['max_s']:.2f} s, bound {rec['bound_s']} s "
                f"({rec['kills']} SIGKILLs)",
            )
        )
    found.append(
        Target(
            22,
            "crash matrix and outage drill unchanged",
            None,
            "checked by the test suite (tests/crash, the outage drill), not by the bench",
        )
    )

    # ---- issue 21
    for peer, at_least in (("LangGraph + PostgresSaver", 1.5), ("DBOS Transact", 2.0)):
        if ours and peer in results:
            ratio = ours / results[peer]["runs_per_s"]
            found.append(
                Target(
                    21,
                    f"CPU-bound: ours/{peer.split(' ')[0]} at least {at_least}x",
                    ratio >= at_least,
                    f"{ratio:.2f}",
                )
            )
    lengths = engine.get("lengths") or []
    if lengths:
        costs = " / ".join(f"{r['per_step_ms']:.3f}" for r in lengths)
        steps = " / ".join(str(r["steps"]) for r in lengths)
        growth = lengths[-1]["per_step_ms"] / lengths[0]["per_step_ms"]
        found.append(
            Target(
                21,
                f"per-step cost flat at {steps} steps (longest within {FLAT_PER_STEP}x the shortest)",
                growth <= FLAT_PER_STEP,
                f"{costs} ms per step ({growth:.2f}x)",
            )
        )
    if pa:
        native, model = pa.get("native"), pa.get("pa-model")
        tools = pa.get("pa-tools")
        found.append(
            Target(
                21,
                "what Pydantic AI costs per step (reported)",
                True if native and model else None,
                f"native {native['ms_per_step']:.2f}, Pydantic AI tools {tools['ms_per_step']:.2f}, "
                f"Pydantic AI tools + model {model['ms_per_step']:.2f} ms per step "
                f"(+{model['ms_per_step'] - native['ms_per_step']:.2f} ms)"
                if native and model and tools
                else "no figures",
                reported=True,
            )
        )
    else:
        found.append(Target(21, "what Pydantic AI costs per step", None, "no figures"))
    found += _latency_targets(21, "sleeping", sleeping, 200, 2.2, peers_too=False)
    found.append(_start_latency(21, inflight, 100))
    found += _agent_peer_targets(results, sleeping["results"])
    return [*found, *_unmeasured(found)]


def _agent_peer_targets(engine: dict, sleeping: dict) -> list[Target]:
    """Issue 32: ours against the same Pydantic AI agent on DBOSDurability."""
    found = []
    ours, peer = engine.get("ours (engine in-process)"), engine.get(AGENT_PEER)
    if ours and peer:
        ratio = ours["runs_per_s"] / peer["runs_per_s"]
        found.append(
            Target(
                32,
                f"CPU-bound: ours/{AGENT_PEER} at least 2x",
                ratio >= 2.0,
                f"{ratio:.2f} ({ours['runs_per_s']:.1f} against {peer['runs_per_s']:.1f} runs/s)",
            )
        )
    ours_at = row_at(sleeping.get(OURS) or [], 200)
    peer_at = row_at(sleeping.get(f"{AGENT_PEER} (queue)") or [], 200)
    if ours_at and peer_at:
        mine, theirs = 200 / ours_at["wall_s"], 200 / peer_at["wall_s"]
        found.append(
            Target(
                32,
                f"sleeping: N=200 runs/s at least {AGENT_PEER}'s",
                mine >= theirs,
                f"ours {mine:.1f} runs/s, {theirs:.1f} (ours/peer {mine / theirs:.2f})",
            )
        )
    found.append(
        Target(
            32,
            "in-process CPU per step within 1.3x the previous main's",
            None,
            "measured by `benchmarks.ab_engine` against main's checkout (a second checkout), "
            "not by `make bench`: docs/BENCHMARKS.md, 'The same agent on DBOSDurability'",
        )
    )
    return found


# every target collect() knows, by the start of its text: one without a row was not measured
EXPECTED = (
    (22, "CPU-bound: ours/floor"),
    (22, "CPU-bound: ours/fastest peer"),
    (22, "SIGKILL recovery"),
    (21, "CPU-bound: ours/LangGraph"),
    (21, "CPU-bound: ours/DBOS"),
    (21, "per-step cost"),
    (32, "CPU-bound: ours/Pydantic AI agent"),
    (32, "sleeping: N=200 runs/s at least Pydantic AI agent"),
)


def _unmeasured(found: list[Target]) -> list[Target]:
    return [
        Target(issue, f"{text} (as named in the issue)", None, "no figures in this run")
        for issue, text in EXPECTED
        if not any(t.issue == issue and t.text.startswith(text) for t in found)
    ]


def markdown(found: list[Target]) -> str:
    lines = [
        "## Targets of issues 22, 21 and 32, side by side in one `make bench`",
        "",
        f"Written by `benchmarks/targets.py` at the end of `make bench`"
        f"{' (BENCH_QUICK=1: smaller rounds)' if os.environ.get('BENCH_QUICK') else ''}; "
        f"1-minute load average {os.getloadavg()[0]:.1f} at the end (a 2-core machine shared "
        "with other work: compare ratios, not absolute figures).",
        "",
        "| issue | target | result | figures |",
        "|---:|---|---|---|",
    ]
    for t in found:
        lines.append(f"| {t.issue} | {t.text} | **{t.verdict()}** | {t.figures} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    text = markdown(collect())
    print(text)
    if args.write_docs:
        write_marked_section("targets", text)


if __name__ == "__main__":
    main()
