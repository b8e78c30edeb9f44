// A chat is a conversation (issue 33): the same chat id takes the next user message, each one a
// run of the chat's thread given the whole history; the chat's chunks are one cursor across runs.
import assert from "node:assert/strict";
import { test } from "node:test";
import { TestChat, api, chatId, eventually, readChunks, resumeChat, texts } from "./lib.mjs";

const AGENT = "pa-talk"; // tests/thread_agents.py: answers with every prompt it was given

test("three turns of one chat, an approval answered in the second", async () => {
  const chat = new TestChat({ id: chatId("thread"), agent: AGENT, input: {} });
  await chat.sendMessage({ text: "hello there" });
  await chat.settled();
  assert.equal(chat.assistant.length, 1);
  assert.equal(texts(chat.assistant[0]).at(-1).text, "heard: hello there");

  await chat.sendMessage({ text: "refund 500 please" });
  await chat.settled();
  assert.equal(chat.assistant.length, 2, JSON.stringify(chat.messages, null, 1));
  const part = chat.assistant[1].parts.find((p) => p.type === "tool-talk_refund");
  assert.equal(part?.state, "approval-requested", JSON.stringify(chat.assistant[1], null, 1));
  await chat.addToolApprovalResponse({ id: part.approval.id, approved: true, reason: "ok" });
  await eventually(
    () => chat.status === "ready" && chat.assistant[1].metadata?.status === "succeeded",
    { message: "the second turn to finish after the approval" },
  );
  assert.deepEqual(chat.errors, []);
  assert.equal(chat.assistant.length, 2, "the continuation extends the second turn's message");
  assert.match(texts(chat.assistant[1]).at(-1).text, /^done: talk_refund=.*500/);

  await chat.sendMessage({ text: "thanks" });
  await chat.settled();
  assert.equal(chat.assistant.length, 3);
  assert.equal(
    texts(chat.assistant[2]).at(-1).text,
    "heard: hello there | refund 500 please | thanks",
  );
  const runIds = chat.assistant.map((m) => m.metadata.runId);
  assert.equal(new Set(runIds).size, 3);

  const thread = await api(`/api/threads/${encodeURIComponent(chat.id)}`);
  assert.equal(thread.status, 200);
  assert.deepEqual(thread.body.runs.map((r) => r.id), runIds);
  assert.deepEqual(thread.body.runs.map((r) => r.status), ["succeeded", "succeeded", "succeeded"]);
  assert.deepEqual(
    thread.body.messages.filter((m) => m.author === "customer").map((m) => m.text),
    ["hello there", "refund 500 please", "thanks"],
  );

  // the chat's chunks, read with startIndex from 0 to the end: one gap-free cursor
  const all = [];
  const offsets = [];
  for (;;) {
    const response = await resumeChat(AGENT, chat.id, all.length);
    offsets.push([Number(response.headers.get("x-chat-chunk-offset")), all.length]);
    const { chunks, ended } = await readChunks(response);
    assert.ok(ended);
    if (chunks.length === 0) break;
    all.push(...chunks);
  }
  const starts = all.filter((c) => c.type === "start").map((c) => c.messageMetadata.runId);
  assert.deepEqual([...new Set(starts)], runIds, "the runs' chunks, in turn order");
  // any index resumes inside the same sequence (the middle of the second turn, say)
  const middle = all.findIndex((c) => c.type === "start" && c.messageMetadata.runId === runIds[1]) + 3;
  const tail = await readChunks(await resumeChat(AGENT, chat.id, middle));
  assert.deepEqual(tail.chunks, all.slice(middle, middle + tail.chunks.length));
  assert.ok(tail.chunks.length > 0);
});
