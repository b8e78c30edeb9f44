// The run page's stream client (DESIGN.md 5): keeps the last seq, reconnects with capped
// exponential backoff and jitter on any close that is not a refusal, resumes with after=,
// and ignores frames it has already applied. No framework.
(function () {
  "use strict";
  const root = document.getElementById("run");
  if (!root) return;
  const runId = root.dataset.runId;
  const conn = document.getElementById("conn");
  const liveText = document.getElementById("live-text");
  const output = document.getElementById("run-output");
  const statusChip = document.getElementById("run-status");
  const eventsList = document.getElementById("events");
  const TERMINAL = ["succeeded", "failed", "cancelled"];
  let lastSeq = parseInt(root.dataset.lastSeq || "0", 10);
  let attempt = 0;
  let socket = null;
  let finished = TERMINAL.includes(root.dataset.status);
  let refused = false;

  function setConn(state, text) {
    conn.dataset.state = state;
    conn.textContent = text || state;
  }

  function turnFor(step, att) {
    let el = liveText.querySelector(`.turn[data-step="${step}"][data-attempt="${att}"]`);
    if (!el) {
      el = document.createElement("p");
      el.className = "turn";
      el.dataset.step = step;
      el.dataset.attempt = att;
      liveText.appendChild(el);
    }
    return el;
  }

  function apply(frame) {
    if (typeof frame.seq !== "number" || frame.seq <= lastSeq) return; // already applied
    lastSeq = frame.seq;
    root.dataset.lastSeq = String(lastSeq);
    const d = frame.data || {};
    if (frame.type === "model.delta") {
      const el = turnFor(d.step, d.attempt);
      el.textContent += d.text;
    } else if (frame.type === "model.superseded") {
      const el = liveText.querySelector(`.turn[data-step="${d.step}"][data-attempt="${d.attempt}"]`);
      if (el) el.classList.add("superseded");
    } else if (frame.type === "run.output") {
      output.textContent = d.text;
    } else if (frame.type === "run.status") {
      statusChip.textContent = d.status;
      statusChip.className = "chip s-" + d.status;
      root.dataset.status = d.status;
      if (TERMINAL.includes(d.status)) { finished = true; setConn("finished", "finished"); }
    }
    if (frame.html && eventsList) {
      eventsList.insertAdjacentHTML("beforeend", frame.html);
    }
    if (frame.type.startsWith("step.") || frame.type.startsWith("approval.")) {
      scheduleStepsRefresh();
    }
  }

  let refreshTimer = null;
  function scheduleStepsRefresh() {
    // the step table is server-rendered: fetch the page and swap the table in place
    if (refreshTimer) return;
    refreshTimer = setTimeout(async function () {
      refreshTimer = null;
      try {
        const res = await fetch(window.location.pathname, { headers: { "X-Requested-With": "runstream" } });
        if (!res.ok) return;
        const doc = new DOMParser().parseFromString(await res.text(), "text/html");
        for (const id of ["steps"]) {
          const fresh = doc.getElementById(id);
          const here = document.getElementById(id);
          if (fresh && here) here.innerHTML = fresh.innerHTML;
        }
        const svg = doc.querySelector(".svgwrap");
        const svgHere = document.querySelector(".svgwrap");
        if (svg && svgHere) svgHere.innerHTML = svg.innerHTML;
      } catch (e) { /* next event will try again */ }
    }, 300);
  }

  function connect() {
    const proto = window.location.protocol === "https:" ? "wss" : "ws";
    const url = `${proto}://${window.location.host}/ws/runs/${runId}/?after=${lastSeq}`;
    setConn(attempt === 0 ? "connecting" : "reconnecting", attempt === 0 ? "connecting…" : "reconnecting…");
    socket = new WebSocket(url);
    socket.onopen = function () {
      attempt = 0;
      setConn(finished ? "finished" : "live", finished ? "finished" : "live");
    };
    socket.onmessage = function (msg) {
      let frame;
      try { frame = JSON.parse(msg.data); } catch (e) { return; }
      if (frame.type === "pong") return;
      apply(frame);
    };
    socket.onclose = function (ev) {
      socket = null;
      if (ev.code >= 4400 && ev.code < 4500) {
        refused = true;
        setConn("refused", "refused: " + (ev.reason || ev.code));
        return;
      }
      attempt += 1;
      const base = Math.min(10000, 250 * Math.pow(2, attempt - 1));
      const delay = base / 2 + Math.random() * base / 2;
      setConn("reconnecting", "reconnecting…");
      setTimeout(connect, delay);
    };
  }

  window.addEventListener("online", function () { if (!socket && !refused) connect(); });
  connect();
})();
