// Approvals through the protocol, with the AI SDK's own chat client (AbstractChat,
// DefaultChatTransport, addToolApprovalResponse, sendAutomaticallyWhen).
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  ORDERS, TestChat, api, buildMessage, chatId, eventually, postChat, readChunks, refundsOf, resumeChat,
  run, texts, tools, userMessage,
} from "./lib.mjs";

const ORDER_BIG = (i) => ORDERS.big[i]; // full refunds of these need an approval
const plain = (value) => JSON.parse(JSON.stringify(value));
const refundPart = (chat) =>
  chat.assistant.at(-1)?.parts.find((p) => p.type === "tool-issue_refund");

async function parkedChat(orderId, prefix) {
  const chat = new TestChat({ id: chatId(prefix), agent: "refund", input: { order_id: orderId } });
  await chat.sendMessage({ text: "The blender arrived broken, I want my money back." });
  await chat.settled();
  const part = refundPart(chat);
  assert.equal(part?.state, "approval-requested", JSON.stringify(chat.messages, null, 1));
  return { chat, part };
}

test("an approval requested and answered through the chat", async () => {
  const order = ORDER_BIG(0);
  const { chat, part } = await parkedChat(order.id, "approve");
  assert.equal(chat.assistant.length, 1);
  const runId = chat.assistant[0].metadata.runId;
  const pending = await api("/api/approvals?status=pending", { user: "inbox" });
  const item = pending.body.approvals.find((a) => String(a.id) === part.approval.id);
  assert.equal(item.run_id, runId);

  await chat.addToolApprovalResponse({ id: part.approval.id, approved: true, reason: "ok" });
  await eventually(() => chat.status === "ready" && chat.assistant[0].metadata.status === "succeeded", {
    message: "the continuation to finish",
  });
  assert.deepEqual(chat.errors, []);
  assert.equal(chat.assistant.length, 1, "the continuation extends the same message");
  const message = chat.assistant[0];
  const done = await run(runId);
  assert.equal(done.status, "succeeded");
  assert.equal(texts(message).at(-1).text, done.output);
  const refund = refundPart(chat);
  assert.equal(refund.state, "output-available");
  assert.equal(refund.approval.approved, true);
  assert.equal(refund.output.amount_cents, order.amount_cents);
  assert.ok(tools(message).every((p) => p.state === "output-available"));
  const ledger = await refundsOf(order.id);
  assert.deepEqual(ledger.map((r) => r.amount_cents), [order.amount_cents]);

  // a repeated answer (a retried POST) is not a second decision: the same continuation again
  const again = await postChat("refund", { id: chat.id, messages: chat.messages.map((m) => answered(m)) });
  const repeat = await readChunks(again);
  assert.ok(repeat.ended);
  assert.equal((await refundsOf(order.id)).length, 1);
});

/** A copy of a message with its issue_refund part answered (approved unless said). */
function answered(message, approved = true) {
  return {
    ...message,
    parts: message.parts.map((p) =>
      p.type === "tool-issue_refund" && p.approval
        ? { ...p, state: "approval-responded", approval: { id: p.approval.id, approved } }
        : p,
    ),
  };
}

test("a viewer's answer is refused and changes nothing", async () => {
  const order = ORDER_BIG(1);
  const { chat, part } = await parkedChat(order.id, "viewer");
  const response = await postChat(
    "refund",
    { id: chat.id, messages: chat.messages.map((m) => answered(m)) },
    "viewer",
  );
  assert.equal(response.status, 403);
  assert.match((await response.json()).error, /approvals.decide_approval/);
  const pending = await api("/api/approvals?status=pending", { user: "inbox" });
  assert.ok(pending.body.approvals.some((a) => String(a.id) === part.approval.id));
  assert.deepEqual(await refundsOf(order.id), []);
});

test("a decision in the inbox shows in the chat; a late chat answer cannot undo it", async () => {
  // rejected in the inbox, then the chat resumes: the tool is denied, the agent says why
  const rejected = await parkedChat(ORDER_BIG(2).id, "inbox-reject");
  const no = await api(`/api/approvals/${rejected.part.approval.id}`, {
    user: "inbox",
    method: "POST",
    body: { decision: "reject", reason: "outside the return window" },
  });
  assert.equal(no.status, 200);
  await eventually(async () => (await run(rejected.chat.assistant[0].metadata.runId)).status === "succeeded");
  await rejected.chat.resumeStream();
  await rejected.chat.settled();
  assert.equal(rejected.chat.assistant.length, 1);
  const denied = refundPart(rejected.chat);
  assert.equal(denied.state, "output-denied");
  assert.match(denied.approval.reason, /rejected by inbox: outside the return window/);
  assert.match(texts(rejected.chat.assistant[0]).at(-1).text, /No refund was issued/);
  assert.deepEqual(await refundsOf(ORDER_BIG(2).id), []);

  // approved in the inbox while the chat user still says no: the chat shows what happened
  const order = ORDER_BIG(3);
  const raced = await parkedChat(order.id, "inbox-approve");
  const yes = await api(`/api/approvals/${raced.part.approval.id}`, {
    user: "inbox",
    method: "POST",
    body: { decision: "approve" },
  });
  assert.equal(yes.status, 200);
  await raced.chat.addToolApprovalResponse({ id: raced.part.approval.id, approved: false });
  await eventually(() => raced.chat.status === "ready" && raced.chat.assistant[0].metadata.status === "succeeded", {
    message: "the continuation to finish",
  });
  assert.deepEqual(raced.chat.errors, []);
  const refund = refundPart(raced.chat);
  assert.equal(refund.state, "output-available");
  assert.equal(refund.approval.approved, true);
  const ledger = await refundsOf(order.id);
  assert.deepEqual(ledger.map((r) => r.amount_cents), [order.amount_cents]);
  // and a reader from the start sees the same message
  const replay = await readChunks(await resumeChat("refund", raced.chat.id, 0));
  const { message } = await buildMessage(replay.chunks);
  assert.deepEqual(plain(message.parts), plain(raced.chat.assistant[0].parts));
});

