"""The last step of `make bench`: every target of issues 22, 21, 32 and 43, "met" or "not met"
with its figures, from what this run's harnesses wrote (var/bench-engine.json by `benchmarks.run`,
var/bench-inflight.json by `benchmarks.inflight`, var/bench-pydantic-ai.json by
`benchmarks.pydantic_ai_flow --json`, var/bench-step-cost.json by `benchmarks.step_cost`,
var/bench-deployment.json by `benchmarks.deployment --json`), so every figure comes from the same
`make bench`. Where the deployment also ran a baseline checkout (BENCH_BASELINE), its figure
stands beside ours ("before").

    .venv/bin/python -m benchmarks.targets [--write-docs]

A missing file or row is reported as "not measured" (never as met). No Django: it only reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
BARE_AGENT = "Pydantic AI agent, no durability"  # ... with no durability at all


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
    found += _issue_43(results, sleeping, streaming, inflight)
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


def _issue_43(engine: dict, sleeping: dict, streaming: dict, inflight: dict) -> list[Target]:
    """Issue 43: the engine's overhead cut to the loop's own, every latency-bound target met."""
    found = _deployment_targets(_load("bench-deployment.json"))
    found += _latency_targets(43, "streaming", streaming, 200, 1.5, peers_too=False)
    found += _latency_targets(43, "sleeping", sleeping, 1000, 2.0, peers_too=False)
    for label, side in (("sleeping", sleeping), ("streaming", streaming)):
        found += _ahead_of_every_peer(label, side.get("results") or {}, 200)
    mine = engine.get("ours (engine in-process)") or {}
    ours = mine.get("runs_per_s")
    for peer, at_least in ((BARE_AGENT, 0.8), (AGENT_PEER, 2.0)):
        other = engine.get(peer) or {}
        theirs = other.get("runs_per_s")
        text = f"CPU-bound: ours/{'no durability' if peer == BARE_AGENT else peer} at least {at_least}x"
        if ours and theirs:
            cpu = (
                f"; CPU per run {mine['cpu_ms_per_run']:.1f} against {other['cpu_ms_per_run']:.1f} ms"
                if "cpu_ms_per_run" in mine and "cpu_ms_per_run" in other
                else ""
            )
            found.append(
                Target(
                    43,
                    text,
                    ours / theirs >= at_least,
                    f"{ours / theirs:.2f} ({ours:.1f} against {theirs:.1f} runs/s{cpu})",
                )
            )
        else:
            found.append(Target(43, text, None, "no figures"))
    found += _first_delta_targets(inflight, streaming)
    found.append(_step_cost_target(_load("bench-step-cost.json")))
    found.append(
        Target(
            43,
            "crash matrix, outage, pause and partition drills, Pydantic AI feature tests and "
            "the suite's wall time no worse",
            None,
            "checked by the test suite, not by the bench",
        )
    )
    return found


def _deployment_targets(dep: dict) -> list[Target]:
    """Worker CPU per run against the bare loop's, and 100 runs against one, through the real
    deployment (`benchmarks.deployment`): B's median over rounds, A's beside it when it ran."""
    results = dep.get("results") or {}
    mine, before = results.get("b") or [], results.get("a") or []
    runs = (dep.get("args") or {}).get("runs", 100)
    cpu_text = "worker CPU per run through the deployment within 2x the bare loop's"
    batch_text = f"deployment: {runs} runs within 2.5x one run"
    if not mine:
        return [
            Target(43, cpu_text, None, "no figures"),
            Target(43, batch_text, None, "no figures"),
        ]

    def median(side: list[dict], key: str) -> float | None:
        values = [r["batch"][key] for r in side if key in r.get("batch", {})]
        return statistics.median(values) if values else None

    def was(key: str, fmt: str) -> str:
        value = median(before, key)
        return f"; before ({before[0]['commit']}): {fmt.format(value)}" if value else ""

    over_floor, over_one = median(mine, "over_floor"), median(mine, "over_one")
    cpu, floor = (
        median(mine, "worker_cpu_ms"),
        statistics.median(
            f["cpu_ms_per_run"] for f in dep.get("floor") or [{"cpu_ms_per_run": float("nan")}]
        ),
    )
    one = statistics.median(r["one_run_s"] for r in mine)
    wall = median(mine, "wall_s")
    return [
        Target(
            43,
            cpu_text,
            over_floor <= 2.0 if over_floor is not None else None,
            f"{over_floor:.2f}x ({cpu:.1f} ms against {floor:.1f} ms, {mine[0]['commit']})"
            + was("over_floor", "{:.2f}x")
            if over_floor is not None
            else "no figures",
        ),
        Target(
            43,
            batch_text,
            over_one <= 2.5 if over_one is not None else None,
            f"{over_one:.2f}x ({wall:.2f} s against {one:.2f} s, {mine[0]['commit']})"
            + was("over_one", "{:.2f}x")
            if over_one is not None
            else "no figures",
        ),
    ]


def _ahead_of_every_peer(label: str, results: dict, n: int) -> list[Target]:
    text = f"{label}: N={n} runs/s ahead of every peer, LangGraph included"
    ours = row_at(results.get(OURS) or [], n)
    rates = {
        name: row_at(rows, n)["n"] / row_at(rows, n)["wall_s"]
        for name, rows in results.items()
        if name != OURS and row_at(rows, n)
    }
    if not (ours and rates):
        return [Target(43, text, None, "no figures" if not ours else "no peer ran")]
    mine = n / ours["wall_s"]
    best = max(rates, key=rates.get)
    others = ", ".join(f"{k} {v:.1f}" for k, v in rates.items())
    return [
        Target(
            43,
            text,
            mine > rates[best],
            f"ours {mine:.1f} runs/s, {others} (ours/fastest {mine / rates[best]:.2f})",
        )
    ]


def _first_delta_targets(inflight: dict, streaming: dict) -> list[Target]:
    """POST -> the first `model.delta` on the run's socket: one run at a time on PostgreSQL +
    Redis (inflight's start latency), and for the probe's runs inside the streaming N=200 batch."""
    redis = next((r for r in inflight.get("starts") or [] if "Redis" in r["case"]), None)
    alone = "first delta p50 one run at a time (PostgreSQL + Redis) at most 50 ms"
    found = [
        Target(
            43,
            alone,
            redis["p50_ms"] <= 50 if redis else None,
            f"p50 {redis['p50_ms']:.0f} ms, p99 {redis['p99_ms']:.0f} ms"
            if redis
            else "no figures",
        )
    ]
    row = row_at((streaming.get("results") or {}).get(OURS) or [], 200)
    inside = "first delta p50 inside the streaming N=200 batch at most 150 ms"
    socket = row.get("first_delta_socket_p50_ms") if row else None
    if socket is None:
        found.append(Target(43, inside, None, "no figures"))
    else:
        db = row.get("first_delta_db_p50_ms")
        found.append(
            Target(
                43,
                inside,
                socket <= 150,
                f"socket p50 {socket:.0f} ms, max {row['first_delta_socket_max_ms']:.0f} ms "
                "(POST -> first frame, the probe's runs)"
                + (
                    f"; the batch's own runs, created -> first event: p50 {db:.0f} ms" if db else ""
                ),
            )
        )
    return found


def _step_cost_target(step: dict) -> Target:
    rows, growth = step.get("rows") or [], step.get("growth")
    if not rows:
        return Target(43, "engine's own CPU per step at 400 calls within 1.3x", None, "no figures")
    first, last, bound = rows[0], rows[-1], step.get("target", 1.3)
    text = (
        f"engine's own CPU per step at {last['calls']} calls within {bound}x of at "
        f"{first['calls']} (the bare loop's subtracted)"
    )
    unfinished = [r for r in rows if not r.get("finished", True)]
    if unfinished:
        r = unfinished[0]
        return Target(
            43,
            text,
            False,
            f"the {r['calls']}-call run did not finish within {step.get('budget_s', 0):g} s: "
            f"{r['steps_done']} of {r['steps']} steps after {r['slices']} slices of "
            f"{step.get('slice_seconds', 0):g} s",
        )
    figures = " / ".join(
        f"{r['engine_cpu_ms_per_step']:.3f} ms at {r['calls']} calls ({r['slices_median']:g} slices)"
        for r in rows
    )
    return Target(
        43,
        text,
        growth <= bound if growth is not None else None,
        f"{figures}: {growth:.2f}x" if growth is not None else f"{figures}: no ratio",
    )


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
    (43, "worker CPU per run"),
    (43, "deployment: "),
    (43, "streaming: N=200 within"),
    (43, "sleeping: N=1000 within"),
    (43, "sleeping: N=200 runs/s"),
    (43, "streaming: N=200 runs/s"),
    (43, "CPU-bound: ours/no durability"),
    (43, "CPU-bound: ours/Pydantic AI agent + DBOSDurability"),
    (43, "first delta p50 one run at a time"),
    (43, "first delta p50 inside the streaming N=200 batch"),
    (43, "engine's own CPU per step"),
)


def _unmeasured(found: list[Target]) -> list[Target]:
    return [
        Target(issue, f"{text} (as named in the issue)", None, "no figures in this run")
        for issue, text in EXPECTED
        if not any(t.issue == issue and t.text.startswith(text) for t in found)
    ]


def markdown(found: list[Target]) -> str:
    lines = [
        "## Targets of issues 22, 21, 32 and 43, side by side in one `make bench`",
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
