// A worker SIGKILLed mid-stream (failpoint model_streaming:script-short=crash_once): the
// superseded attempt is reset, so no reader is left with half a text part.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  buildMessage, chatId, postChat, readChunks, resumeChat, run, texts, userMessage,
} from "./lib.mjs";

const TEXT = Array.from({ length: 120 }, (_, i) => `token${i}`).join(" ");

test("a worker killed mid-stream leaves no broken part", async () => {
  const id = chatId("crash");
  const response = await postChat("script-short", {
    id,
    messages: [userMessage("go")],
    input: { script: [{ text: TEXT }] },
  });
  const runId = response.headers.get("x-run-id");
  const live = await readChunks(response); // one connection, through the crash
  assert.ok(live.ended);
  const types = live.chunks.map((c) => c.type);
  assert.ok(types.includes("reset-step"), types.join(" "));
  const late = await readChunks(await resumeChat("script-short", id, 0));
  assert.deepEqual(late.chunks, live.chunks);

  const { message, errors } = await buildMessage(live.chunks);
  assert.deepEqual(errors, []);
  const done = await run(runId);
  assert.equal(done.status, "succeeded");
  assert.ok(done.steps[0].attempts >= 2, "the model step was not retried: no crash happened");
  assert.deepEqual(texts(message).map((p) => [p.text, p.state]), [[done.output, "done"]]);
  assert.equal(done.output, TEXT);
});
