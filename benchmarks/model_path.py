"""The CPU of the model path alone (no database): per model request and per streamed chunk.

    .venv/bin/python -m benchmarks.model_path --a /path/to/old-checkout --b . --rounds 5

The scripted provider (a Pydantic AI `FunctionModel`, providers/scripted.py) answers turns of
`--tokens` tokens without any delay, so only CPU is measured, three ways:
- `instant`: the path of a model that never waits (`model_request` on the thread's loop);
- `stream`: the streamed path (the one a waiting model takes), every delta back to sync code;
- `sink`: the streamed path with the deltas taken inside the stream's coroutine (the executor's
  delta feed after a turn's first delta), where the checkout has it (`TextSink`).
Each is run with `--tokens` and with one token a turn: the difference is the per-chunk cost, the
rest the per-request cost. A and B alternate in fresh processes, so noise hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, sys, time, types
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
from agentruns.registry import ScriptedTurn
from agentruns.runtime.providers import ModelRequest
from agentruns.runtime.providers.scripted import ScriptedProvider
try:
    from agentruns.runtime.providers.base import TextSink
except ImportError:  # a checkout before the sink
    TextSink = None

tokens, requests = int(sys.argv[1]), int(sys.argv[2])

def measure(mode, count):
    text = " ".join(f"tok{i}" for i in range(count))
    agent = types.SimpleNamespace(scripted_policy=lambda messages: ScriptedTurn(text=text))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    got = []
    def once():
        provider = ScriptedProvider()
        provider.instant = mode == "instant"
        request = ModelRequest(model="scripted", messages=messages, tools=[], agent=agent)
        if mode == "sink":
            sink = TextSink()
            sink.take = got.append
            items = list(provider.stream(request, sink=sink))
        else:
            items = list(provider.stream(request))
        return items
    for _ in range(50):
        once()
    cpu = time.process_time()
    for _ in range(requests):
        once()
    return (time.process_time() - cpu) * 1e6 / requests

modes = ["instant", "stream"] + (["sink"] if TextSink is not None else [])
for mode in modes:
    print(mode, measure(mode, tokens), measure(mode, 1))
"""


def one_round(checkout: Path, tokens: int, requests: int) -> dict[str, tuple[float, float]]:
    """{mode: (CPU µs per request, CPU µs per chunk)}."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tokens), str(requests)],
        cwd=checkout,
        env={"LOG_LEVEL": "WARNING", "SCRIPTED_MODEL_DELAY_MS": "0", "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    )
    result = {}
    for line in out.stdout.strip().splitlines():
        mode, many, one = line.split()
        per_chunk = (float(many) - float(one)) / (tokens - 1)
        result[mode] = (float(many), per_chunk)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", required=True, type=Path)
    parser.add_argument("--b", required=True, type=Path)
    parser.add_argument("--tokens", type=int, default=25)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    seen: dict[str, dict[str, list[tuple[float, float]]]] = {"a": {}, "b": {}}
    for round_no in range(args.rounds):
        for side in ("a", "b") if round_no % 2 == 0 else ("b", "a"):
            for mode, figures in one_round(getattr(args, side), args.tokens, args.requests).items():
                seen[side].setdefault(mode, []).append(figures)
        print(f"round {round_no + 1} done", flush=True)
    print(f"CPU µs per request of {args.tokens} tokens / per chunk (median of {args.rounds}):")
    for side in ("a", "b"):
        for mode, figures in seen[side].items():
            per_request = statistics.median(f[0] for f in figures)
            per_chunk = statistics.median(f[1] for f in figures)
            print(
                f"  {side.upper()} {mode:8s} {per_request:8.0f} µs/request {per_chunk:6.1f} µs/chunk"
            )
    for mode in seen["a"]:
        a = statistics.median(f[0] for f in seen["a"][mode])
        b = statistics.median(f[0] for f in seen["b"].get(mode, seen["a"][mode]))
        print(f"  B/A {mode}: {b / a:.3f} per request")
    if "sink" in seen["b"]:
        a = statistics.median(f[0] for f in seen["a"]["stream"])
        b = statistics.median(f[0] for f in seen["b"]["sink"])
        print(f"  B sink / A stream: {b / a:.3f} per request")


if __name__ == "__main__":
    main()
