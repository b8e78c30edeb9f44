"""The CPU of the model path alone (no database): per model request and per streamed chunk.

    .venv/bin/python -m benchmarks.model_path --a /path/to/other-checkout --b . --rounds 5

The scripted model (a Pydantic AI `FunctionModel`, providers/scripted_model.py) answers turns of
`--tokens` tokens without any delay, so only CPU is measured, each request as the engine's model
unit makes it (`model_unit.request_model`; both checkouts need the engine, runtime/engine/):
- `whole`: the path of a model that does not stream (`Model.request`, awaited on the thread's
  own loop, as the unit's `_whole` does);
- `stream`: the streamed path (the one a waiting model takes: a task of the process's stream
  loop, `stream_pump.run_streaming`), every delta back to sync code;
- `sink`: the streamed path with the deltas taken inside the stream's task (the delta feed
  after a turn's first delta, `TextSink.take`).
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
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from agentruns.registry import ScriptedTurn
from agentruns.registry.pydantic_agents.calls import thread_loop
from agentruns.runtime.engine.model.request import request_model
from agentruns.runtime.providers import TextSink
from agentruns.runtime.providers.scripted_model import Playing, ScriptedModel, playing
from agentruns.runtime.providers.stream_pump import run_streaming

tokens, requests = int(sys.argv[1]), int(sys.argv[2])

class Params:
    messages = [ModelRequest(parts=[UserPromptPart("hi")], instructions="Be brief.")]
    model_settings = None
    model_request_parameters = ModelRequestParameters(allow_text_output=True)

class Streamed(ScriptedModel):
    waits = True  # as with a delay, without waiting

def measure(mode, count):
    text = " ".join(f"tok{i}" for i in range(count))
    policy = lambda messages: ScriptedTurn(text=text)
    model = ScriptedModel() if mode == "whole" else Streamed()
    got = []
    def once():
        if mode == "whole":
            return thread_loop().run_until_complete(request_model(model, Params, None))
        sink = TextSink()
        if mode == "sink":
            sink.take = got.append
        deltas = run_streaming(lambda: request_model(model, Params, None), sink)
        try:
            while True:
                next(deltas)
        except StopIteration as end:
            return end.value
    with playing(Playing(policy=policy, instructions="Be brief.")):
        for _ in range(50):
            once()
        cpu = time.process_time()
        for _ in range(requests):
            once()
    return (time.process_time() - cpu) * 1e6 / requests

for mode in ("whole", "stream", "sink"):
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
    a = statistics.median(f[0] for f in seen["b"]["stream"])
    b = statistics.median(f[0] for f in seen["b"]["sink"])
    print(f"  B sink / B stream: {b / a:.3f} per request")


if __name__ == "__main__":
    main()
