"""What one model request costs through Pydantic AI's OpenAI model, against the bare OpenAI SDK.

    .venv/bin/python -m benchmarks.model_provider --requests 200 --rounds 5

The fake OpenAI-compatible server (scripts/fake_openai_server.py, `echo` mode, no delay) runs as
its own process, so this process's CPU is the client's alone. Each request is a mid-run turn:
system prompt, user message, an answered tool call, three tool schemas, a streamed answer of
~60 chunks. The legs alternate in rounds:
- `sdk`: the `openai` SDK's own streaming loop on one sync client, what the hand-written
  provider (`openai_provider.py`, removed) did per request: the floor;
- `engine`: the request as the engine's model unit makes it (`model_for("openai/fake")`, the
  process's `OpenAIChatModel`; `model.unit.request_model` as a task of the process's run loop,
  `lanes.run_on_process_loop`, every delta handed back to this thread; tests/model_requests.py).
Prints per-request wall time (median, p95) and CPU (process time / requests) of each leg, the
median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "note": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
    for name in ("lookup_order", "refund", "reply")
]
MESSAGES = [
    {"role": "system", "content": "You are a refund agent. Be brief."},
    {"role": "user", "content": json.dumps({"order_id": "ORD-1001", "note": "x" * 440})},
    {
        "role": "assistant",
        "content": "Looking it up.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "ORD-1001"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"amount_cents": 4200}'},
    {"role": "user", "content": "Received the lookup; " + "y" * 440},
]


def _start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/fake_openai_server.py")]
        + ["--port", str(port), "--mode", "echo", "--delay-ms", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    proc.stdout.readline()  # "fake OpenAI-compatible server on ..."
    return proc, f"http://127.0.0.1:{port}/v1"


def _sdk_leg(url: str) -> Callable[[], int]:
    import openai

    client = openai.OpenAI(base_url=url, api_key="not-set", max_retries=0)

    def one() -> int:
        stream = client.chat.completions.create(
            model="fake",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        deltas = 0
        with stream:
            for chunk in stream:
                for choice in chunk.choices or []:
                    if choice.delta and choice.delta.content:
                        deltas += 1
        return deltas

    return one


def _engine_leg() -> Callable[[], int]:
    from pydantic_ai.tools import ToolDefinition

    from agentruns.runtime.providers.models import model_for
    from tests.model_requests import ask, conversation, params

    request = params(
        conversation(MESSAGES),
        [
            ToolDefinition(
                name=t["function"]["name"],
                description=t["function"]["description"],
                parameters_json_schema=t["function"]["parameters"],
            )
            for t in TOOLS
        ],
    )

    def one() -> int:
        deltas, _ = ask(model_for("openai/fake"), request)
        return len(deltas)

    return one


def _measure(one: Callable[[], int], requests: int) -> dict[str, float]:
    walls: list[float] = []
    cpu_start = time.process_time()
    for _ in range(requests):
        started = time.perf_counter()
        if one() < 10:
            raise SystemExit("the answer was not streamed")
        walls.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu_start
    walls.sort()
    return {
        "wall_p50_ms": 1000 * statistics.median(walls),
        "wall_p95_ms": 1000 * walls[int(0.95 * (len(walls) - 1))],
        "cpu_ms": 1000 * cpu / requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server, url = _start_server()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["OPENAI_BASE_URL"] = url
    os.environ["OPENAI_API_KEY"] = ""
    import django

    django.setup()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    legs = {"sdk": _sdk_leg(url), "engine": _engine_leg()}
    try:
        for one in legs.values():  # warm up: imports, connections
            _measure(one, 20)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in legs}
        for _ in range(args.rounds):
            for name, one in legs.items():
                results[name].append(_measure(one, args.requests))
    finally:
        server.terminate()
        server.wait()
    print(f"{args.requests} requests x {args.rounds} rounds, median of rounds")
    print(f"{'leg':<14}{'wall p50 ms':>13}{'wall p95 ms':>13}{'CPU ms/request':>16}")
    for name, rounds in results.items():
        row = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        print(
            f"{name:<14}{row['wall_p50_ms']:>13.2f}{row['wall_p95_ms']:>13.2f}"
            f"{row['cpu_ms']:>16.2f}"
        )


if __name__ == "__main__":
    main()
