// Helpers of the Node tests: the real `ai` package against the live server that
// tests/stream/test_ai_sdk_client.py starts (daphne + qcluster on the test PostgreSQL).
import assert from "node:assert/strict";
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  parseJsonEventStream,
  readUIMessageStream,
  uiMessageChunkSchema,
} from "ai";

export const BASE = process.env.CHAT_BASE_URL;
export const TOKENS = JSON.parse(process.env.CHAT_TOKENS || "{}");
export const ORDERS = JSON.parse(process.env.CHAT_ORDERS || "{}");
const CONTROL = process.env.CHAT_CONTROL_URL;

export const auth = (user = "chatter") => ({ Authorization: `Bearer ${TOKENS[user]}` });
export const chatId = (prefix) => `${prefix}-${crypto.randomUUID()}`;
export const userMessage = (text) => ({
  id: crypto.randomUUID(),
  role: "user",
  parts: [{ type: "text", text }],
});

export function postChat(agent, body, user = "chatter") {
  return fetch(`${BASE}/api/chat/${agent}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...auth(user) },
    body: JSON.stringify({ trigger: "submit-message", ...body }),
  });
}

export function resumeChat(agent, id, startIndex, user = "chatter") {
  const query = startIndex === undefined ? "" : `?startIndex=${startIndex}`;
  return fetch(`${BASE}/api/chat/${agent}/${encodeURIComponent(id)}/stream${query}`, {
    headers: auth(user),
  });
}

/** Chunks of a response, each parsed with the package's own parser and chunk schema.
 * `limit`: stop (and hang up) after that many; `onChunk(chunk, count)`: called for each;
 * `ended`: the server closed the stream; `dropped`: the connection broke (with
 * `tolerateDrop`, else that throws). */
export async function readChunks(response, { limit = Infinity, onChunk, tolerateDrop = false } = {}) {
  assert.equal(response.status, 200, await peek(response));
  const reader = parseJsonEventStream({
    stream: response.body,
    schema: uiMessageChunkSchema,
  }).getReader();
  const chunks = [];
  while (chunks.length < limit) {
    let next;
    try {
      next = await reader.read();
    } catch (error) {
      if (!tolerateDrop) throw error;
      return { chunks, ended: false, dropped: error };
    }
    const { done, value } = next;
    if (done) return { chunks, ended: true };
    assert.ok(value.success, `chunk failed uiMessageChunkSchema: ${JSON.stringify(value.rawValue)}`);
    assert.deepEqual(value.value, value.rawValue, "the schema changed a chunk");
    chunks.push(value.value);
    onChunk?.(value.value, chunks.length);
  }
  await reader.cancel();
  return { chunks, ended: false };
}

async function peek(response) {
  if (response.status === 200) return "";
  return `${response.status}: ${await response.clone().text()}`;
}

/** The assistant message readUIMessageStream builds from chunks, and any error it reported. */
export async function buildMessage(chunks, message = undefined) {
  const stream = new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  const errors = [];
  let last = message;
  for await (const snapshot of readUIMessageStream({
    message,
    stream,
    onError: (error) => errors.push(error),
  })) {
    last = snapshot;
  }
  return { message: last, errors };
}

export const texts = (message) => message.parts.filter((p) => p.type === "text");
export const tools = (message) => message.parts.filter((p) => p.type.startsWith("tool-"));

export async function api(path, { user = "chatter", method = "GET", body } = {}) {
  const response = await fetch(`${BASE}${path}`, {
    method,
    headers: { "content-type": "application/json", ...auth(user) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: await response.json() };
}

export async function run(runId) {
  const { status, body } = await api(`/api/runs/${runId}`);
  assert.equal(status, 200);
  return body;
}

export async function refundsOf(orderId) {
  const response = await fetch(`${BASE}/gateway/refunds?order_id=${orderId}`);
  return (await response.json()).refunds;
}

/** Ask the test harness to restart the web server (same port); resolves once it answers. */
export async function restartWebServer() {
  const response = await fetch(`${CONTROL}/restart-web`, { method: "POST" });
  assert.equal(response.status, 200, await response.text());
}

export async function eventually(check, { timeoutMs = 60000, message = "condition" } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${message}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** A headless chat on the AI SDK's own AbstractChat + DefaultChatTransport. */
class MemoryState {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (message) => { this.messages = [...this.messages, message]; };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (index, message) => {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
  };
  snapshot = (thing) => structuredClone(thing);
}

export class TestChat extends AbstractChat {
  constructor({ id, agent, input, user = "chatter" }) {
    const errors = [];
    super({
      id,
      state: new MemoryState(),
      transport: new DefaultChatTransport({
        api: `${BASE}/api/chat/${agent}`,
        headers: auth(user),
        body: { input },
      }),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      onError: (error) => errors.push(error),
    });
    this.errors = errors;
  }

  get assistant() {
    return this.messages.filter((m) => m.role === "assistant");
  }

  async settled() {
    await eventually(() => this.status === "ready" || this.status === "error", {
      message: "the chat to settle",
    });
    assert.deepEqual(this.errors, []);
  }
}
