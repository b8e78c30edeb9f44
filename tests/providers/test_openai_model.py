"""`openai/<model>` on its own: the model the engine asks (`model_for`: Pydantic AI's OpenAI
model, the real `openai` SDK under it), one request as the engine's model unit makes it
(tests/model_requests.py), against the fake server's real socket."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from pydantic_ai.messages import TextPart, ToolCallPart
from pydantic_ai.tools import ToolDefinition

from agentruns.runtime.providers import ModelError
from agentruns.runtime.providers.models import model_for
from scripts.fake_openai_server import Fail, Reply
from tests.model_requests import ask, conversation, params, stream
from tests.procs import ROOT
from tests.providers.kit import API_KEY, MODEL

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "t_echo",
            "description": "Echo.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    },
]
MESSAGES = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": json.dumps({"order_id": "ORD-1001"})},
]


def collect(messages: list[dict] | None = None) -> tuple[list[str], object]:
    """(the text deltas, the response) of one request of the conversation, with TOOLS."""
    tools = [
        ToolDefinition(
            name=t["function"]["name"],
            description=t["function"]["description"],
            parameters_json_schema=t["function"]["parameters"],
        )
        for t in TOOLS
    ]
    return ask(model_for(MODEL), params(conversation(messages or MESSAGES), tools))


def test_streams_text_then_assembles_split_tool_calls_then_usage(openai_settings, fake):
    long_args = {"text": "a fairly long argument that must arrive in many pieces " * 3}
    fake.script(
        Reply(
            text="Let me check both of those for you.",
            tool_calls=[("lookup_order", {"order_id": "ORD-1001"}), ("t_echo", long_args)],
            chunk_chars=3,
            usage=(120, 30),
        )
    )
    deltas, response = collect()

    assert len(deltas) > 5  # streamed piece by piece, not in one block
    assert "".join(deltas) == "Let me check both of those for you."
    calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    assert [(c.tool_call_id, c.tool_name) for c in calls] == [
        ("call_2_0", "lookup_order"),
        ("call_2_1", "t_echo"),
    ]
    assert json.loads(calls[0].args) == {"order_id": "ORD-1001"}
    assert json.loads(calls[1].args) == long_args
    assert (response.usage.input_tokens, response.usage.output_tokens) == (120, 30)
    # order of the protocol: all text, then complete calls
    kinds = [type(p) for p in response.parts]
    assert kinds == [TextPart, ToolCallPart, ToolCallPart]
    # the arguments really were split on the wire: one chunk per 3 characters
    assert fake.chunks_sent[0] > len(json.dumps(long_args)) // 3

    (request,) = fake.chat_requests()
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.body["model"] == "fake-model"
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.body["messages"] == MESSAGES
    # Pydantic AI's OpenAI profile closes each object schema (additionalProperties: false);
    # otherwise the tools go out as the engine declared them
    sent = request.body["tools"]
    for tool in sent:
        assert tool["function"]["parameters"].pop("additionalProperties") is False
    assert sent == TOOLS


def test_a_server_that_reports_no_usage_gets_the_engines_estimate(openai_settings, fake):
    """Token and cost budgets count a request whose server reported no tokens (characters / 4)."""
    fake.script(Reply(text="x" * 400, usage=(0, 0)))
    _, response = collect()
    assert response.usage.output_tokens == 100
    prompt = "".join(m["content"] for m in MESSAGES)  # one request: the system and user parts
    assert response.usage.input_tokens == len(prompt) // 4


def test_request_options_from_settings_are_sent(openai_settings, fake):
    openai_settings.OPENAI_REQUEST_OPTIONS = '{"temperature": 0, "max_tokens": 64, "stream": false}'
    fake.script(Reply(text="ok"))
    collect()
    body = fake.chat_requests()[0].body
    assert body["temperature"] == 0 and body["max_tokens"] == 64
    assert body["stream"] is True  # the model owns the streaming protocol


def test_rate_limit_is_retried_after_retry_after(openai_settings, fake):
    fake.script(Fail(429, retry_after=1), Reply(text="after the wait"))
    deltas, _ = collect()
    assert "".join(deltas) == "after the wait"
    first, second = fake.chat_requests()
    # the SDK waited as long as the server asked (a lower bound, not a performance claim)
    assert second.received_at - first.received_at >= 1.0
    assert second.body == first.body


def test_server_error_is_retried_inside_the_call(openai_settings, fake):
    fake.script(Fail(500), Fail(503), Reply(text="recovered"))
    deltas, _ = collect()
    assert "".join(deltas) == "recovered"
    assert len(fake.chat_requests()) == 3


def test_persistent_server_errors_are_a_retryable_model_error(openai_settings, fake):
    openai_settings.OPENAI_MAX_RETRIES = 1
    fake.script(Fail(500), Fail(500))
    with pytest.raises(ModelError) as info:
        collect()
    assert info.value.retryable is True
    assert "HTTP 500" in str(info.value)
    assert len(fake.chat_requests()) == 2


def test_auth_error_is_not_retried_and_never_shows_the_key(openai_settings, fake, caplog):
    fake.script(Fail(401, message=f"Incorrect API key provided: {API_KEY}."))
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(ModelError) as info:
            collect()
    assert info.value.retryable is False
    message = str(info.value)
    assert message.startswith("authentication failed (HTTP 401)")
    assert "OPENAI_API_KEY" in message
    assert API_KEY not in message
    assert API_KEY not in caplog.text
    assert len(fake.chat_requests()) == 1


def test_quota_exhausted_is_not_retried(openai_settings, fake):
    openai_settings.OPENAI_MAX_RETRIES = 0  # the SDK retries any 429; the engine must not
    fake.script(Fail(429, "You exceeded your current quota.", code="insufficient_quota"))
    with pytest.raises(ModelError) as info:
        collect()
    assert info.value.retryable is False and "quota" in str(info.value)


def test_invalid_request_fails_without_retry(openai_settings, fake):
    # a tool call nobody answered: the (fake, like the real) API rejects the conversation
    broken = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_x",
                    "type": "function",
                    "function": {"name": "t_echo", "arguments": "{}"},
                }
            ],
        }
    ]
    with pytest.raises(ModelError) as info:
        collect(broken)
    assert info.value.retryable is False
    assert "invalid request (HTTP 400)" in str(info.value) and "call_x" in str(info.value)
    assert len(fake.chat_requests()) == 1


def test_stream_broken_midway_is_retryable_after_partial_text(openai_settings, fake):
    fake.script(
        Reply(text="this answer will be cut off halfway through", chunk_chars=4, drop_after=4)
    )
    received: list[str] = []
    with pytest.raises(ModelError) as info:
        for delta in stream(model_for(MODEL), params(conversation(MESSAGES))):
            received.append(delta)
    assert info.value.retryable is True
    assert (
        received
        and "".join(received)
        == "this answer will be cut off halfway through"[: len("".join(received))]
    )


def test_unreachable_endpoint_is_retryable(openai_settings):
    from tests.procs import free_port

    openai_settings.OPENAI_BASE_URL = f"http://127.0.0.1:{free_port()}/v1"
    openai_settings.OPENAI_MAX_RETRIES = 0
    with pytest.raises(ModelError) as info:
        collect()
    assert info.value.retryable is True and "unreachable" in str(info.value)


def test_a_process_that_builds_no_openai_model_never_loads_the_sdk():
    """The OpenAI SDK is imported where an OpenAI model is built: a web process, a worker on
    the scripted model or a `manage.py` command does not pay ~0.25 s of CPU to load it."""
    code = (
        "import sys, django; django.setup()\n"
        "from agentruns.runtime.providers.models import model_for\n"
        "model_for('scripted')\n"
        "print('without', 'openai' in sys.modules)\n"
        "model_for('openai:gpt-4o-mini')\n"
        "print('with', 'openai' in sys.modules)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": ""}
    env.update(SQLITE_PATH=os.devnull, AGENTRUNS_MODEL="scripted", OPENAI_BASE_URL="")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-3:-1] == ["without False", "with True"], done.stdout
