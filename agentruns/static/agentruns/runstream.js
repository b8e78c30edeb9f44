// The run page's stream client (DESIGN.md 5), no framework.
//
// The page is rendered up to data-last-seq; the socket continues with after=<last seq>. Every
// frame {"seq","type","data","html"} is applied at most once (seq <= lastSeq is dropped), in
// order; a hole in the seqs means something went wrong on the way, so the client reconnects with
// after=<last applied> rather than show a gap. Any close that is not a refusal (4400-4499) is
// retried with capped exponential backoff and jitter: a dropped connection, a server restart,
// and 4503 ("try again later": the database is down, the server accepts and closes at once).
// So a socket only counts as up (the backoff resets, "live" shows) once the server has answered
// something on it: the ping sent on open, or a frame. Model text follows the same rules as the
// server's first render (selectors.live_turns): text per (step, attempt); an attempt is dropped
// when a model.superseded event names it or a newer attempt of that step starts streaming.
(function () {
  "use strict";
  const root = document.getElementById("run");
  if (!root) return;
  const runId = root.dataset.runId;
  const conn = document.getElementById("conn");
  const liveText = document.getElementById("live-text");
  const output = document.getElementById("run-output");
  const statusChip = document.getElementById("run-status");
  const banner = document.getElementById("run-banner");
  // the banner at once when the run ends (the page's refresh then brings its exact words)
  const ENDED = { succeeded: ["done", "Finished"], failed: ["failed", "The run failed"], cancelled: ["stopped", "Stopped"] };
  const eventsList = document.getElementById("events");
  const TERMINAL = ["succeeded", "failed", "cancelled"];
  const BACKOFF_BASE_MS = 250;
  const BACKOFF_CAP_MS = 8000;
  // "try again later" (the server holds as many sockets as it may): 1013, or 4013 from daphne
  // (which cannot send 1013); it is not a refusal: wait longer, growing
  const BUSY_BASE_MS = 5000;
  const BUSY_CAP_MS = 120000;
  const PING_EVERY_MS = 15000;
  const SILENCE_LIMIT_MS = 45000; // no frame or pong for this long: the connection is dead

  let lastSeq = parseInt(root.dataset.lastSeq || "0", 10);
  let failures = 0; // consecutive closes without a successful open
  let busy = 0; // consecutive "try later" closes; an open does not reset it, a frame does
  let socket = null;
  let retryTimer = null;
  let refused = false;
  let finished = TERMINAL.includes(root.dataset.status);
  let lastHeard = Date.now();
  let answered = false; // the current socket has heard from the server
  const dropped = new Set(); // "step:attempt" whose text was superseded
  const newest = new Map(); // step -> newest attempt seen streaming

  for (const el of liveText.querySelectorAll(".turn")) {
    const step = el.dataset.step, att = parseInt(el.dataset.attempt, 10);
    if (!newest.has(step) || newest.get(step) < att) newest.set(step, att);
  }

  function setConn(state, text) {
    conn.dataset.state = state;
    conn.textContent = text;
  }

  function showSteady() {
    if (finished) setConn("finished", "finished");
    else setConn("live", "live");
  }

  function turnEl(step, att) {
    return liveText.querySelector(`.turn[data-step="${step}"][data-attempt="${att}"]`);
  }

  function dropAttempt(step, att) {
    dropped.add(`${step}:${att}`);
    const el = turnEl(step, att);
    if (el) el.remove();
  }

  function appendText(step, att, text) {
    step = String(step);
    if (dropped.has(`${step}:${att}`)) return;
    const seen = newest.get(step) || 0;
    if (att > seen) {
      for (let older = 1; older < att; older++) dropAttempt(step, older);
      newest.set(step, att);
    }
    let el = turnEl(step, att);
    if (!el) {
      el = document.createElement("p");
      el.className = "turn";
      el.dataset.step = step;
      el.dataset.attempt = String(att);
      liveText.appendChild(el);
    }
    el.textContent += text;
  }

  function setBanner(tone, text) {
    banner.className = "run-banner tone-" + tone;
    banner.dataset.tone = tone;
    banner.textContent = text;
  }

  function apply(frame) {
    const d = frame.data || {};
    if (frame.type === "model.delta") {
      appendText(d.step, d.attempt, d.text || "");
    } else if (frame.type === "model.superseded") {
      dropAttempt(String(d.step), d.attempt);
    } else if (frame.type === "run.output") {
      output.textContent = d.text;
    } else if (frame.type === "run.status") {
      statusChip.textContent = d.status;
      statusChip.className = "chip s-" + d.status;
      root.dataset.status = d.status;
      finished = TERMINAL.includes(d.status);
      if (banner && ENDED[d.status]) setBanner(ENDED[d.status][0], ENDED[d.status][1]);
      else if (banner && d.status === "running" && banner.dataset.tone !== "working") {
        setBanner("working", "The agent is working…");
      }
      showSteady();
    }
    if (frame.html && eventsList) eventsList.insertAdjacentHTML("beforeend", frame.html);
    if (frame.type.startsWith("step.") || frame.type.startsWith("approval.") || frame.type === "run.status") {
      scheduleRefresh();
    }
  }

  // The step table, the approval card, the SVG timeline, the replies sent, the hand-overs and
  // the actions (or who may act) are server-rendered: after step or approval events, fetch the
  // page once (debounced) and swap those parts in place.
  let refreshTimer = null;
  function scheduleRefresh() {
    if (refreshTimer) return;
    refreshTimer = setTimeout(async function () {
      refreshTimer = null;
      try {
        const res = await fetch(window.location.pathname, { headers: { "X-Requested-With": "runstream" } });
        if (!res.ok) return;
        const doc = new DOMParser().parseFromString(await res.text(), "text/html");
        for (const sel of ["#steps", "#approval-card", ".svgwrap", ".facts", ".run-head .actions", "#run-replies", "#run-handovers", "#run-notes"]) {
          const fresh = doc.querySelector(sel);
          const here = document.querySelector(sel);
          if (fresh && here) here.innerHTML = fresh.innerHTML;
        }
        // the status and outcome chips (their colour says what the run's work came to) and the
        // banner (where the run stands, in words)
        for (const id of ["run-status", "run-outcome", "run-banner"]) {
          const fresh = doc.getElementById(id);
          const here = document.getElementById(id);
          if (!fresh || !here) continue;
          here.className = fresh.className;
          here.hidden = fresh.hidden;
          if (id === "run-banner") {
            here.dataset.tone = fresh.dataset.tone || "";
            here.innerHTML = fresh.innerHTML; // its <time>: parsed by the browser from our page
          } else {
            here.textContent = fresh.textContent;
          }
        }
      } catch (e) { /* the next event tries again */ }
    }, 300);
  }

  function onFrame(ws, msg) {
    if (ws !== socket) return; // a late message from a socket we already gave up on
    lastHeard = Date.now();
    if (!answered) {
      answered = true;
      failures = 0;
      showSteady();
    }
    let frame;
    try { frame = JSON.parse(msg.data); } catch (e) { return; }
    if (typeof frame.seq !== "number" || typeof frame.type !== "string") return;
    if (frame.type === "pong") return;
    if (frame.seq <= lastSeq) return; // already applied (first render or an earlier socket)
    if (frame.seq !== lastSeq + 1) {
      ws.close(3000, "gap"); // resume from what we have; never show a hole
      return;
    }
    apply(frame);
    lastSeq = frame.seq;
    root.dataset.lastSeq = String(lastSeq);
  }

  function scheduleReconnect() {
    failures += 1;
    const ceiling = busy > 0
      ? Math.min(BUSY_CAP_MS, BUSY_BASE_MS * Math.pow(2, busy - 1))
      : Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * Math.pow(2, failures - 1));
    const delay = ceiling / 2 + Math.random() * ceiling / 2; // jitter: no thundering herd
    setConn("reconnecting", "reconnecting…");
    retryTimer = setTimeout(function () { retryTimer = null; connect(); }, delay);
  }

  function connect() {
    if (refused || socket) return;
    const proto = window.location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${proto}://${window.location.host}/ws/runs/${runId}/?after=${lastSeq}`);
    socket = ws;
    if (failures === 0) setConn("connecting", "connecting…");
    answered = false;
    ws.onopen = function () {
      if (ws !== socket) return;
      lastHeard = Date.now();
      try { ws.send('{"type":"ping"}'); } catch (e) { /* onclose follows */ }
    };
    ws.onmessage = function (msg) { busy = 0; onFrame(ws, msg); };
    ws.onclose = function (ev) {
      if (ws !== socket) return;
      socket = null;
      if (ev.code >= 4400 && ev.code < 4500) { // (4013, "try later", is below this range)
        refused = true;
        setConn("refused", "refused: " + (ev.reason || ev.code));
        return;
      }
      busy = ev.code === 1013 || ev.code === 4013 ? busy + 1 : 0;
      scheduleReconnect();
    };
  }

  // keepalive: a silently dead connection (sleeping laptop, dropped NAT entry) is noticed
  setInterval(function () {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    if (Date.now() - lastHeard > SILENCE_LIMIT_MS) { socket.close(3001, "silent"); return; }
    try { socket.send('{"type":"ping"}'); } catch (e) { /* onclose follows */ }
  }, PING_EVERY_MS);

  function reconnectNow() {
    if (socket || refused) return;
    if (retryTimer) { clearTimeout(retryTimer); retryTimer = null; }
    connect();
  }
  // the engineering detail stays open (or closed) across this browser's run pages
  const engineering = document.getElementById("engineering");
  if (engineering) {
    try { engineering.open = window.localStorage.getItem("run-engineering-open") === "1"; } catch (e) { /* storage off */ }
    engineering.addEventListener("toggle", function () {
      try { window.localStorage.setItem("run-engineering-open", engineering.open ? "1" : "0"); } catch (e) { /* storage off */ }
    });
  }

  window.addEventListener("online", reconnectNow);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) reconnectNow(); });
  connect();
})();
