// A chat page on the AI SDK's own client (`ai` 7): AbstractChat + DefaultChatTransport against
// POST /api/chat/<agent>, which runs the agent durably. No framework: a small ChatState that
// re-renders on every change. What it shows:
//   - the assistant message as the UI message stream builds it (text, tool calls, outputs);
//   - approvals: a tool part in state approval-requested gets Approve / Reject; the answer goes
//     back with addToolApprovalResponse and is sent automatically
//     (lastAssistantMessageIsCompleteWithApprovalResponses);
//   - questions: the agent's `ask_human` call waits for its output (state input-available once
//     the run parked); the page asks the question (the choices as buttons, and a text box) and
//     the answer goes back with addToolOutput, sent automatically once;
//   - one chat, many turns: every follow-up continues the same chat id (the server's thread:
//     the agent reads the whole conversation), until "New chat";
//   - resume: the chat (its id and messages) is kept in sessionStorage, so a reload (or a
//     dropped connection) shows the earlier turns and resumes the latest with resumeStream():
//     GET /api/chat/<agent>/<id>/stream, a replay of that turn's message;
//   - tool calls and results in words (amounts in their currency), the JSON one click away;
//   - stop: POST /api/chat/<agent>/<id>/stop ends the run's model turn on the server within a
//     second (the AI SDK's own stop() only drops this page's fetch); the stream, left open,
//     then ends by itself with the text so far, an abort chunk and its finish.
import "./csp.js"; // first: zod without its `new Function` probe (the page's CSP refuses it)
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";

const root = document.getElementById("chat-example");
const agent = root.dataset.agent;
const csrfToken = root.dataset.csrf;
const log = document.getElementById("chat-log");
const form = document.getElementById("chat-form");
const statusLine = document.getElementById("chat-status");
const stopButton = document.getElementById("chat-stop");
const orderField = form.querySelector("input[name=order_id]");
const chatNote = document.getElementById("chat-note");
const STORE = "agentruns-example-chat";

class RenderingState {
  constructor(messages, onChange) {
    this.status = "ready";
    this.error = undefined;
    this.messages = messages;
    this.onChange = onChange;
  }
  set(name, value) { this[name] = value; this.onChange(); }
  pushMessage = (message) => { this.messages = [...this.messages, message]; this.onChange(); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); this.onChange(); };
  replaceMessage = (index, message) => {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
    this.onChange();
  };
  snapshot = (thing) => structuredClone(thing);
}

class PageChat extends AbstractChat {
  constructor({ id, input, messages }) {
    const state = new RenderingState(messages, () => render(this));
    // an answer given here is sent once, as the approvals' responses are
    const answered = { pending: false };
    const sendWhen = (options) => {
      if (answered.pending) { answered.pending = false; return true; }
      return lastAssistantMessageIsCompleteWithApprovalResponses(options);
    };
    super({
      id,
      state,
      transport: new DefaultChatTransport({
        api: `/api/chat/${agent}`,
        headers: { "X-CSRFToken": csrfToken },
        credentials: "same-origin",
        body: { input },
      }),
      sendAutomaticallyWhen: sendWhen,
      onError: () => render(this),
    });
    this.pageState = state;
    this.answered = answered;
    this.input = input;
  }
  answerQuestion(toolCallId, text) {
    this.answered.pending = true;
    return this.addToolOutput({ tool: "ask_human", toolCallId, output: text });
  }
  // AbstractChat reports status changes through setStatus; repaint on each
  setStatus(change) { super.setStatus(change); render(this); }
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child); // text nodes: never parsed as HTML
  return node;
}

const json = (value) => JSON.stringify(value, null, 2);

// ---------------------------------------------------------------- tool calls in words
// A tool's arguments and results as people read them: "order ORD-1001 · amount 40.00 USD"
// (an amount in minor units, `*_cents`, in the currency the call or an earlier result names),
// the JSON one click away.
const STATES = {
  "input-streaming": "being prepared",
  "input-available": "under way",
  "approval-requested": "waiting for your approval",
  "approval-responded": "answered",
  "output-available": "done",
  "output-error": "failed",
  "output-denied": "not done: rejected",
};

const words = (name) => name.replace(/_(cents|ids?)$/, (m, unit) => (unit === "ids" ? "s" : ""))
  .replace(/[_-]+/g, " ").trim();

function money(cents, currency) {
  const sign = cents < 0 ? "-" : "";
  const [whole, part] = (Math.abs(cents) / 100).toFixed(2).split(".");
  return `${sign}${Number(whole).toLocaleString("en-US")}.${part}${currency ? " " + currency : ""}`;
}

function plain(value, currency) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.map((v) => plain(v, currency)).join("; ") || "none";
  if (typeof value === "object") {
    const own = typeof value.currency === "string" ? value.currency : currency;
    return Object.entries(value)
      .filter(([key, v]) => key !== "currency" && v !== "" && v !== null && v !== undefined)
      .map(([key, v]) => key.endsWith("_cents") && typeof v === "number"
        ? `${words(key)} ${money(v, own)}` : `${words(key)} ${plain(v, own)}`)
      .join(" · ");
  }
  return String(value);
}

function currencyOf(message) {
  for (const part of message?.parts || []) {
    for (const value of [part.output, part.input]) {
      if (value && typeof value === "object" && typeof value.currency === "string") return value.currency;
    }
  }
  return "";
}

function asJson(label, value) {
  return el("details", { class: "chat-json" }, el("summary", {}, label), el("pre", {}, json(value)));
}

function toolPart(chat, part, currency) {
  const name = part.type.slice("tool-".length);
  const box = el("div", { class: `chat-tool state-${part.state}`, "data-tool": name },
    el("div", { class: "chat-tool-head" }, el("strong", { class: "chat-tool-name" }, words(name)), " ",
      el("span", { class: "chip chat-tool-state" }, STATES[part.state] || part.state)));
  if (part.input !== undefined && name !== "ask_human") {
    box.append(el("p", { class: "chat-input" }, plain(part.input, currency)), asJson("the call as JSON", part.input));
  }
  if (part.state === "approval-requested") {
    const reason = el("input", { type: "text", placeholder: "reason (optional)", class: "chat-reason" });
    const answer = (approved) => () =>
      chat.addToolApprovalResponse({ id: part.approval.id, approved, reason: reason.value || undefined });
    const yes = el("button", { type: "button", class: "ok" }, "Approve");
    const no = el("button", { type: "button", class: "danger" }, "Reject");
    yes.addEventListener("click", answer(true));
    no.addEventListener("click", answer(false));
    box.append(el("div", { class: "chat-approval" }, "Needs your approval: ", yes, " ", no, " ", reason));
  }
  if (name === "ask_human" && part.state === "input-available" && chat.status === "ready") {
    box.append(questionForm(chat, part));
  }
  if (part.approval?.reason) box.append(el("div", { class: "muted" }, part.approval.reason));
  if (part.state === "output-available") {
    const shown = typeof part.output === "string" ? part.output : plain(part.output, currency);
    box.append(el("p", { class: "chat-output" }, shown));
    if (typeof part.output === "object" && part.output !== null) box.append(asJson("the result as JSON", part.output));
  }
  if (part.state === "output-error") box.append(el("div", { class: "err" }, part.errorText));
  if (part.state === "output-denied") box.append(el("div", { class: "err" }, "Not done: the approver rejected it."));
  return box;
}

function questionForm(chat, part) {
  const { question = "", choices = null } = part.input || {};
  const form = el("form", { class: "chat-question" }, el("p", { class: "chat-question-text" }, question));
  const send = (text) => { if (text.trim()) chat.answerQuestion(part.toolCallId, text.trim()); };
  const offered = Array.isArray(choices) && choices.length;
  for (const choice of offered ? choices : []) {
    const button = el("button", { type: "button", class: "ok chat-choice" }, String(choice));
    button.addEventListener("click", () => send(String(choice)));
    form.append(button, " ");
  }
  // free text is always an answer; the choices, when there are any, come first
  const label = offered ? "another answer" : "your answer";
  const text = el("input", { type: "text", class: "chat-answer", placeholder: label, "aria-label": label });
  form.append(text, " ", el("button", { type: "submit", class: "ok" }, "Answer"));
  form.addEventListener("submit", (event) => { event.preventDefault(); send(text.value); });
  return form;
}

function render(chat) {
  if (!chat.pageState) return; // during construction
  log.replaceChildren(...chat.messages.map((message) => {
    const item = el("li", { class: `chat-msg role-${message.role}` });
    const currency = currencyOf(message);
    for (const part of message.parts) {
      if (part.type === "text") item.append(el("p", { class: "chat-text" }, part.text));
      else if (part.type.startsWith("tool-")) item.append(toolPart(chat, part, currency));
    }
    const runId = message.metadata?.runId;
    if (runId) {
      item.append(el("a", { href: `/runs/${runId}/`, class: "muted" }, "the run"),
        " ", el("span", { class: "chip chat-run-status" }, message.metadata.status || "running"));
    }
    return item;
  }));
  const error = chat.error ? ` — ${chat.error.message}` : "";
  statusLine.textContent = `${chat.status}${error}`;
  statusLine.dataset.status = chat.status;
  const busy = chat.status === "streaming" || chat.status === "submitted";
  form.querySelector("button[type=submit]").disabled = busy;
  stopButton.hidden = !busy;
  showChatNote(chat);
  save(chat);
}

// the order is the chat's (its first message's): a follow-up continues the same chat
function showChatNote(current) {
  const going = Boolean(current && current.messages.length);
  orderField.readOnly = going;
  if (going && current.input?.order_id) orderField.value = current.input.order_id;
  chatNote.hidden = !going;
  chatNote.textContent = going ? "Follow-ups continue this chat: the agent reads the whole conversation. \"New chat\" starts over." : "";
}

function save(current) {
  if (!current || !current.messages.length) return;
  try {
    sessionStorage.setItem(STORE, JSON.stringify({ id: current.id, input: current.input, messages: current.messages }));
  } catch { /* storage full or off: a reload then starts afresh */ }
}

function saved() {
  try { return JSON.parse(sessionStorage.getItem(STORE) || "null"); } catch { return null; }
}

let chat = null;
const previous = saved();
if (previous?.id) {
  // a reload: the earlier turns are ours to keep; the latest assistant message comes back from
  // the server (the resume replays that turn from its start, so it is not kept twice)
  let messages = Array.isArray(previous.messages) ? previous.messages
    : [{ id: `${previous.id}-user`, role: "user", parts: [{ type: "text", text: previous.text || "" }] }];
  if (messages.length && messages[messages.length - 1].role === "assistant") messages = messages.slice(0, -1);
  chat = new PageChat({ id: previous.id, input: previous.input, messages });
  render(chat);
  chat.resumeStream();
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const data = new FormData(form);
  const text = String(data.get("message") || "").trim();
  if (!text) return;
  if (!chat) { // a new chat: its order is the agent's input for every turn
    const input = { order_id: String(data.get("order_id") || "").trim() };
    chat = new PageChat({ id: crypto.randomUUID(), input, messages: [] });
  }
  form.querySelector("input[name=message]").value = "";
  await chat.sendMessage({ text });
});

stopButton.addEventListener("click", async () => {
  if (!chat) return;
  stopButton.disabled = true;
  try {
    const response = await fetch(`/api/chat/${agent}/${encodeURIComponent(chat.id)}/stop`, {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken, "Content-Type": "application/json" },
      credentials: "same-origin",
      body: "{}",
    });
    if (!response.ok) statusLine.textContent = `stop refused: ${(await response.json()).error}`;
  } finally {
    stopButton.disabled = false;
  }
});

document.getElementById("chat-new").addEventListener("click", () => {
  sessionStorage.removeItem(STORE);
  chat = null;
  log.replaceChildren();
  statusLine.textContent = "ready";
  statusLine.dataset.status = "ready";
  showChatNote(null);
});
