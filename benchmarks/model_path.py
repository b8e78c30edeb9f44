"""The CPU of the model path alone (no database): per model request and per streamed chunk.

    .venv/bin/python -m benchmarks.model_path --a /path/to/other-checkout --b . --rounds 5

The scripted model (a Pydantic AI `FunctionModel`, providers/scripted_model.py) answers turns of
`--tokens` tokens without any delay, so only CPU is measured, each request as the checkout's
engine makes it (`request_model`, the model unit's body):
- `whole`: the path of a model that does not stream (`Model.request`);
- `stream`: the streamed path, each text delta handed to the unit's sink inside the request's
  task (the engine of issue 43: `model.unit.delivering(sink)`, the sink's `async deliver(text)`;
  an engine before it: the stream loop's task, `stream_pump.run_streaming` with `TextSink.take`).
The engine of issue 43 awaits its requests in a run's task on the process's loop
(`engine.lanes.run_on_process_loop`), so the requests of a round are awaited one after another
in one task there; an engine before it awaited each on its run thread's own loop. Each mode is
run with `--tokens` and with one token a turn: the difference is the per-chunk cost, the rest
the per-request cost. A and B alternate in fresh processes, so noise hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

from benchmarks.procs import python_for

CHILD = r"""
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from agentruns.registry import ScriptedTurn
from agentruns.runtime.providers.scripted_model import Playing, ScriptedModel, playing

tokens, requests = int(sys.argv[1]), int(sys.argv[2])

class Params:
    messages = [ModelRequest(parts=[UserPromptPart("hi")], instructions="Be brief.")]
    model_settings = None
    model_request_parameters = ModelRequestParameters(allow_text_output=True)

class Streamed(ScriptedModel):
    waits = True  # as with a delay, without waiting

got = []

try:  # the engine of issue 43: requests are awaited in a run's task on the process's loop
    from agentruns.runtime.engine.lanes import run_on_process_loop
    from agentruns.runtime.engine.model.unit import delivering, request_model

    class Sink:
        async def deliver(self, text):
            got.append(text)

    def requests_of(model, policy, count):
        async def batch():
            with playing(Playing(policy=policy, instructions="Be brief.")), delivering(Sink()):
                for _ in range(count):
                    await request_model(model, Params, None)
        run_on_process_loop(batch()).result()

except ImportError:  # an engine before it: a run thread's own loop, the stream loop's pump
    from agentruns.registry.pydantic_agents.calls import thread_loop
    from agentruns.runtime.engine.model.request import request_model
    from agentruns.runtime.providers import TextSink
    from agentruns.runtime.providers.stream_pump import run_streaming

    def requests_of(model, policy, count):
        with playing(Playing(policy=policy, instructions="Be brief.")):
            for _ in range(count):
                if not model.waits:
                    thread_loop().run_until_complete(request_model(model, Params, None))
                    continue
                sink = TextSink()
                sink.take = got.append
                deltas = run_streaming(lambda: request_model(model, Params, None), sink)
                for _ in deltas:
                    pass

def measure(mode, count):
    text = " ".join(f"tok{i}" for i in range(count))
    policy = lambda messages: ScriptedTurn(text=text)
    model = ScriptedModel() if mode == "whole" else Streamed()
    requests_of(model, policy, 50)
    del got[:]
    cpu = time.process_time()
    requests_of(model, policy, requests)
    spent = time.process_time() - cpu
    if mode == "stream":
        assert len(got) >= requests * count, (len(got), requests, count)
    return spent * 1e6 / requests

for mode in ("whole", "stream"):
    print(mode, measure(mode, tokens), measure(mode, 1))
"""


def one_round(checkout: Path, tokens: int, requests: int) -> dict[str, tuple[float, float]]:
    """{mode: (CPU µs per request, CPU µs per chunk)}."""
    out = subprocess.run(
        [python_for(checkout), "-c", CHILD, str(tokens), str(requests)],
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


if __name__ == "__main__":
    main()
