// POST /api/chat/<agent>: the UI message stream of a refund run, read by the real `ai` package.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  BASE, ORDERS, auth, buildMessage, chatId, postChat, readChunks, refundsOf, resumeChat, run,
  texts, tools, userMessage,
} from "./lib.mjs";

const ORDER = ORDERS.small[0]; // asked for $30 of it: under the approval threshold

test("a chat request streams the run; every chunk parses; the message is the run's", async () => {
  const id = chatId("refund");
  const response = await postChat("refund", {
    id,
    messages: [userMessage("My order arrived broken, please refund $30.")],
    input: { order_id: ORDER },
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get("content-type"), "text/event-stream");
  assert.equal(response.headers.get("x-vercel-ai-ui-message-stream"), "v1");
  assert.equal(response.headers.get("x-accel-buffering"), "no");
  const runId = response.headers.get("x-run-id");
  assert.match(runId, /^[0-9a-f-]{36}$/);

  const raw = await response.text();
  assert.ok(raw.endsWith("data: [DONE]\n\n"), raw.slice(-200));
  for (const frame of raw.split("\n\n").filter(Boolean)) assert.match(frame, /^data: /);
  const { chunks } = await readChunks(new Response(raw, { status: 200 }));

  const { message, errors } = await buildMessage(chunks);
  assert.deepEqual(errors, []);
  const done = await run(runId);
  assert.equal(done.status, "succeeded");
  assert.equal(message.id, `run-${runId}`);
  assert.equal(message.role, "assistant");
  const parts = texts(message);
  assert.ok(parts.every((p) => p.state === "done"));
  assert.equal(parts.at(-1).text, done.output);
  const modelTexts = done.steps.filter((s) => s.kind === "model" && s.text).map((s) => s.text);
  assert.deepEqual(parts.map((p) => p.text), modelTexts);

  const toolSteps = done.steps.filter((s) => s.kind === "tool");
  assert.deepEqual(
    tools(message).map((p) => [p.type, p.toolCallId, p.state, p.input, p.output]),
    toolSteps.map((s) => [`tool-${s.tool}`, s.id, "output-available", s.arguments, s.result]),
  );
  const refund = tools(message).find((p) => p.type === "tool-issue_refund");
  assert.equal(refund.output.amount_cents, 3000);
  assert.equal(tools(message)[0].output.customer_email, "••••••"); // redacted as everywhere
  const ledger = await refundsOf(ORDER);
  assert.deepEqual(ledger.map((r) => r.amount_cents), [3000]);
});

test("a double submit streams the same run; another message continues the chat", async () => {
  const id = chatId("double");
  const body = {
    id,
    messages: [userMessage("Please refund $25 for the broken lamp.")],
    input: { order_id: ORDERS.small[1] },
  };
  const [first, second] = await Promise.all([postChat("refund", body), postChat("refund", body)]);
  assert.equal(first.headers.get("x-run-id"), second.headers.get("x-run-id"));
  const [a, b] = await Promise.all([readChunks(first), readChunks(second)]);
  assert.deepEqual(a.chunks, b.chunks);
  assert.ok(a.ended && b.ended);
  const again = await readChunks(await resumeChat("refund", id, 0));
  assert.deepEqual(again.chunks, a.chunks);
  assert.equal((await refundsOf(ORDERS.small[1])).length, 1);

  // the next message is the chat's next run (issue 33), with the chat's input
  const other = await postChat("refund", { ...body, messages: [userMessage("Something else")] });
  assert.equal(other.status, 200);
  const next = other.headers.get("x-run-id");
  assert.notEqual(next, first.headers.get("x-run-id"));
  await readChunks(other);
  assert.equal((await run(next)).input.order_id, ORDERS.small[1]);
});

test("resume: 204 without a run; startIndex slices the same sequence", async () => {
  const none = await resumeChat("refund", chatId("nobody"));
  assert.equal(none.status, 204);
  const id = chatId("slice");
  const whole = await readChunks(
    await postChat("refund", {
      id,
      messages: [userMessage("Refund $21 please")],
      input: { order_id: ORDERS.small[2] },
    }),
  );
  for (const start of [0, 1, 5, whole.chunks.length - 1, whole.chunks.length, 10_000]) {
    const tail = await readChunks(await resumeChat("refund", id, start));
    assert.deepEqual(tail.chunks, whole.chunks.slice(start), `startIndex=${start}`);
    assert.ok(tail.ended);
  }
});

test("refusals are JSON: no token, no right to start, bad requests", async () => {
  const anonymous = await fetch(`${BASE}/api/chat/refund`, { method: "POST", body: "{}" });
  assert.equal(anonymous.status, 401);
  const viewer = await postChat(
    "refund",
    { id: chatId("viewer"), messages: [userMessage("refund")], input: { order_id: ORDER } },
    "viewer",
  );
  assert.equal(viewer.status, 403);
  assert.match((await viewer.json()).error, /agentruns.start_run/);
  const cases = [
    [{ messages: [userMessage("x")] }, 400, /'id' is required/],
    [{ id: "../x", messages: [userMessage("x")] }, 400, /id/],
    [{ id: chatId("e"), messages: [] }, 400, /messages/],
    [{ id: chatId("e"), messages: [{ role: "user", parts: [] }] }, 400, /user message with text/],
    [{ id: chatId("e"), messages: [userMessage("x")], input: { order_id: 5 } }, 400, /invalid input/],
  ];
  for (const [body, status, error] of cases) {
    const response = await postChat("refund", body);
    assert.equal(response.status, status, JSON.stringify(body));
    assert.match((await response.json()).error, error);
  }
  const unknown = await postChat("nope", { id: chatId("n"), messages: [userMessage("x")] });
  assert.equal(unknown.status, 404);
  const badIndex = await fetch(`${BASE}/api/chat/refund/x/stream?startIndex=-1`, { headers: auth() });
  assert.equal(badIndex.status, 400);
});
