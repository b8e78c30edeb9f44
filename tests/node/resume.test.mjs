// Resuming: readers cut at random chunk counts, many readers at once, a web server restart.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  buildMessage, chatId, postChat, readChunks, restartWebServer, resumeChat, run, texts, tools,
  userMessage,
} from "./lib.mjs";

const words = (n, seed) => Array.from({ length: n }, (_, i) => `w${seed}-${i}`).join(" ");
// a slow run (the worker streams a token every few ms): three turns, two tool calls
const SCRIPT = [
  { text: words(60, "a"), calls: [["t_echo", { text: "one" }]] },
  { text: words(60, "b"), calls: [["t_charge", { amount: 3 }]] },
  { text: words(80, "c") },
];

async function startChat(prefix) {
  const id = chatId(prefix);
  const response = await postChat("script", {
    id,
    messages: [userMessage("go")],
    input: { script: SCRIPT },
  });
  return { id, response, runId: response.headers.get("x-run-id") };
}

async function resumeUntilDone(id, chunks, { maxPerConnection }) {
  let connections = 0;
  for (;;) {
    const limit = 1 + Math.floor(Math.random() * maxPerConnection);
    const part = await readChunks(await resumeChat("script", id, chunks.length), { limit });
    chunks.push(...part.chunks);
    connections += 1;
    if (part.ended) return connections;
  }
}

async function checkMessage(chunks, runId) {
  const { message, errors } = await buildMessage(chunks);
  assert.deepEqual(errors, []);
  const done = await run(runId);
  assert.equal(done.status, "succeeded");
  assert.equal(texts(message).at(-1).text, done.output);
  assert.ok(texts(message).every((p) => p.state === "done"));
  assert.deepEqual(tools(message).map((p) => p.state), ["output-available", "output-available"]);
}

test("a reader cut at random chunk counts and resumed gets exactly the uninterrupted chunks", async () => {
  const { id, response, runId } = await startChat("cut");
  const uninterrupted = readChunks(response);
  const tabs = Promise.all([1, 2, 3].map(() => resumeChat("script", id, 0).then(readChunks)));
  const cut = [];
  // at most 4 chunks per connection (2.5 on average): a three-turn run is ~40 chunks, so a
  // dozen or more cuts land everywhere (at most 8 averaged 4.5 and cut only ~9 times)
  const connections = await resumeUntilDone(id, cut, { maxPerConnection: 4 });
  const whole = await uninterrupted;
  assert.ok(whole.ended);
  assert.ok(connections > 10, `only ${connections} connections`);
  assert.deepEqual(cut, whole.chunks);
  for (const tab of await tabs) assert.deepEqual(tab.chunks, whole.chunks);
  await checkMessage(whole.chunks, runId);
});

test("a web server restart mid-stream loses nothing", async () => {
  const { id, response, runId } = await startChat("restart");
  let restarted;
  const first = await readChunks(response, {
    tolerateDrop: true,
    onChunk: (chunk, count) => {
      if (count === 12) restarted = restartWebServer(); // kills the server under this reader
    },
  });
  assert.ok(first.dropped && !first.ended, "the connection outlived the server");
  await restarted;
  // resume from what we have, on the new server process
  const got = first.chunks;
  await resumeUntilDone(id, got, { maxPerConnection: 50 });
  const fresh = await readChunks(await resumeChat("script", id, 0));
  assert.deepEqual(got, fresh.chunks);
  await checkMessage(got, runId);
});
