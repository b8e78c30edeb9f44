// The approval inbox: live diff of edits, claims, bulk selection and the keyboard.
// No inline script or style anywhere (the Content Security Policy allows only static files).
(function () {
  "use strict";

  // ---------------------------------------------------------------- the list's poll
  // The poll sends the signature of what it shows; the server answers 204 when it is current.
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.elt.id !== "inbox-items") return;
    const state = document.getElementById("inbox-state");
    event.detail.parameters.sig = state ? state.dataset.signature || "" : "";
  });

  // ---------------------------------------------------------------- the poll while the server is away
  // A failed poll (503 while the database is down, no answer while the server restarts) shows
  // "reconnecting…" and the next polls wait a capped, jittered backoff; the first poll that
  // answers again swaps in the list as it is now (it sends the signature it shows, so nothing
  // is doubled or skipped) and the normal 2 s rhythm resumes.
  const POLL_BACKOFF_BASE_MS = 1000;
  const POLL_BACKOFF_CAP_MS = 15000;
  let pollFailures = 0;
  let pollNotBefore = 0;

  function isPoll(event) {
    return Boolean(event.detail.elt && event.detail.elt.id === "inbox-items");
  }

  function showPollState(state) {
    const el = document.getElementById("inbox-conn");
    if (!el) return;
    el.dataset.state = state;
    el.hidden = state === "live";
    el.textContent = state === "live" ? "" : "reconnecting…";
  }

  function pollFailed(event) {
    if (!isPoll(event)) return;
    pollFailures += 1;
    const ceiling = Math.min(POLL_BACKOFF_CAP_MS, POLL_BACKOFF_BASE_MS * Math.pow(2, pollFailures - 1));
    pollNotBefore = Date.now() + ceiling / 2 + Math.random() * ceiling / 2;
    showPollState("reconnecting");
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (isPoll(event) && Date.now() < pollNotBefore) event.preventDefault(); // backing off
  });
  document.addEventListener("htmx:responseError", pollFailed);
  document.addEventListener("htmx:sendError", pollFailed);
  document.addEventListener("htmx:afterRequest", function (event) {
    if (!isPoll(event) || !event.detail.successful) return;
    pollFailures = 0;
    pollNotBefore = 0;
    showPollState("live");
  });

  // ---------------------------------------------------------------- live diff of edits
  // a field's value as its data-original holds it (a checkbox's as "true"/"false")
  function valueOf(field) {
    return field.type === "checkbox" ? String(field.checked) : field.value;
  }

  document.addEventListener("input", function (event) {
    const form = event.target.closest("form.decide");
    if (!form) return;
    const changes = [];
    form.querySelectorAll("[data-original]").forEach(function (field) {
      const now = valueOf(field);
      if (now !== field.dataset.original) {
        const unit = field.dataset.unit ? " " + field.dataset.unit : ""; // an amount's currency
        const name = field.dataset.label || field.name.replace(/^arg_/, ""); // "Amount", not amount_cents
        changes.push(name + ": " + field.dataset.original + unit + " → " + now + unit);
      }
    });
    const preview = form.querySelector(".diff-preview");
    if (preview) preview.textContent = changes.length ? "Will approve with: " + changes.join(", ") : "";
    const approve = form.querySelector("button[value=approve]");
    if (approve) approve.textContent = changes.length ? "Approve with changes" : "Approve";
  });

  // ---------------------------------------------------------------- decided elsewhere
  // The list is re-rendered by its poll. A card whose form you were filling in (an amount
  // typed, a reason, a note, or the focus in it) is not dropped without a word when another
  // approver decides the item meanwhile: it stays where it was, says who decided what (read
  // from the item's own page), and keeps what you typed, read-only, for you to copy or
  // dismiss. While the item is still open (one of two approvals given), what you typed is
  // carried into its re-rendered form.
  function typedIn(form) {
    if (form.contains(document.activeElement)) return true;
    return Array.from(form.querySelectorAll("input, textarea, select")).some(function (field) {
      if (field.type === "hidden" || field.type === "submit") return false;
      if (field.dataset.original !== undefined) return valueOf(field) !== field.dataset.original;
      return field.type !== "checkbox" && field.value.trim() !== "";
    });
  }

  let keptCards = []; // {card, form, after, focused} of the list before its swap

  document.addEventListener("htmx:beforeSwap", function (event) {
    if (!event.detail.target || event.detail.target.id !== "inbox-items") return;
    keptCards = [];
    document.querySelectorAll("#inbox-items article.card").forEach(function (card) {
      const form = card.querySelector("form.decide");
      const already = card.classList.contains("decided-elsewhere"); // kept until dismissed
      if (!form || (!already && !typedIn(form))) return;
      const before = card.previousElementSibling;
      keptCards.push({
        card: card,
        form: form,
        already: already,
        after: before && before.id ? before.id : "",
        focused: form.contains(document.activeElement) ? document.activeElement.name : "",
      });
    });
  });

  function carryValues(from, to) {
    from.querySelectorAll("input, textarea, select").forEach(function (field) {
      if (!field.name || field.type === "hidden" || field.type === "submit") return;
      const twin = to.querySelector('[name="' + field.name + '"]');
      if (!twin || twin.type === "hidden") return;
      if (field.type === "checkbox") twin.checked = field.checked;
      else twin.value = field.value;
      twin.dispatchEvent(new Event("input", { bubbles: true })); // the preview of the change
    });
  }

  async function decidedWords(approvalId) {
    try {
      const res = await fetch("/approvals/" + approvalId + "/", { credentials: "same-origin" });
      if (!res.ok) return { words: "" };
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      const line = doc.querySelector("#approval-" + approvalId + " .decided");
      const chip = doc.querySelector("#approval-" + approvalId + " .card-head .chip");
      if (!line) return { words: "", chip: chip };
      line.querySelectorAll("br").forEach(function (br) { br.replaceWith("; "); });
      return { words: line.textContent.replace(/\s+/g, " ").trim(), chip: chip };
    } catch (e) {
      return { words: "" };
    }
  }

  function putBack(kept) {
    const list = document.getElementById("inbox-items");
    const anchor = kept.after && document.getElementById(kept.after);
    if (anchor && anchor.parentNode) anchor.after(kept.card);
    else {
      const first = list.querySelector("article.card");
      if (first) first.before(kept.card); else list.append(kept.card);
    }
  }

  function keepDecided(kept) {
    const card = kept.card;
    putBack(kept);
    if (kept.already) return;
    card.classList.add("decided-elsewhere");
    card.querySelectorAll("input.select-item").forEach(function (box) { box.checked = false; box.disabled = true; });
    card.querySelectorAll("form button, .claim-slot").forEach(function (el) {
      if (el.tagName === "BUTTON") el.disabled = true; else el.remove();
    });
    kept.form.querySelectorAll("input, textarea, select").forEach(function (field) {
      if (field.type === "checkbox" || field.tagName === "SELECT") field.disabled = true;
      else field.readOnly = true;
    });
    const note = document.createElement("div");
    note.className = "note msg-warning decided-elsewhere-note";
    note.setAttribute("role", "alert");
    const text = document.createElement("p");
    text.className = "decided-by-other";
    text.textContent = "Someone else decided this item while you were filling it in. Nothing you typed was sent; it is kept below.";
    const dismiss = document.createElement("button");
    dismiss.type = "button";
    dismiss.className = "link dismiss-kept";
    dismiss.textContent = "Dismiss";
    dismiss.addEventListener("click", function () { card.remove(); });
    note.append(text, dismiss);
    card.querySelector(".card-head").after(note);
    decidedWords(card.dataset.approval).then(function (decided) {
      const words = decided.words;
      if (decided.chip) { // the card's state chip as the item's own page shows it now
        const chip = card.querySelector(".card-head .chip");
        if (chip) { chip.className = decided.chip.className; chip.textContent = decided.chip.textContent; }
      }
      if (words) {
        text.textContent = "While you were filling this in: " + words.charAt(0).toUpperCase() + words.slice(1) +
          ". Nothing you typed was sent; it is kept below.";
      }
    });
  }

  document.addEventListener("htmx:afterSwap", function (event) {
    if (!event.detail.target || event.detail.target.id !== "inbox-items") return;
    const kept = keptCards;
    keptCards = [];
    kept.forEach(function (item) {
      const fresh = document.getElementById(item.card.id);
      if (!fresh) { keepDecided(item); return; }
      const form = fresh.querySelector("form.decide");
      if (form && form !== item.form) carryValues(item.form, form); // re-rendered: an approval given
      if (item.focused && form) {
        const field = form.querySelector('[name="' + item.focused + '"]');
        if (field && document.activeElement !== field) field.focus();
      }
    });
  });

  // ---------------------------------------------------------------- claims: decide anyway?
  function heldByOther(card) {
    return card && card.dataset.claimedBy && card.dataset.claimMine !== "1" ? card.dataset.claimedBy : "";
  }

  function setOverride(form, on) {
    const field = form.querySelector("input[name=override_claim]");
    if (field) field.value = on ? "1" : "";
  }

  document.addEventListener("htmx:confirm", function (event) {
    const elt = event.detail.elt;
    if (elt.matches("form.decide")) {
      const holder = heldByOther(elt.closest("article.card"));
      if (holder && !window.confirm(holder + " is on this item. Decide it anyway?")) {
        event.preventDefault();
        return;
      }
      setOverride(elt, Boolean(holder));
    } else if (elt.id === "bulk-form") {
      const picked = selectedCards();
      const submitter = event.detail.triggeringEvent && event.detail.triggeringEvent.submitter;
      const reason = elt.querySelector("input[name=reason]");
      if (!picked.length) {
        event.preventDefault();
        window.alert("Select items first (x, or the boxes).");
        return;
      }
      const note = elt.querySelector("input[name=internal_note]");
      if (submitter && submitter.value === "reject" && reason && !reason.value.trim() && !(note && note.value.trim())) {
        event.preventDefault();
        reason.focus();
        reason.placeholder = "to reject: a reason for the customer, an internal note, or both";
        return;
      }
      const held = picked.map(heldByOther).filter(Boolean);
      if (held.length) {
        const ask = held.length + " of the selected items are taken by " +
          Array.from(new Set(held)).join(", ") + ". Decide those too?";
        setOverride(elt, window.confirm(ask));
      } else {
        setOverride(elt, false);
      }
    }
  });

  // ---------------------------------------------------------------- bulk selection
  function selectedCards() {
    return Array.from(document.querySelectorAll("input.select-item:checked")).map(function (box) {
      return box.closest("article.card");
    }).filter(Boolean);
  }

  function updateCount() {
    const label = document.querySelector("#bulk-form .bulk-count");
    if (!label) return;
    const n = document.querySelectorAll("input.select-item:checked").length;
    label.textContent = n ? n + " selected" : "none selected";
  }

  document.addEventListener("change", function (event) {
    if (event.target.matches("input.select-all")) {
      document.querySelectorAll("input.select-item").forEach(function (box) {
        box.checked = event.target.checked;
      });
    }
    if (event.target.matches("input.select-item, input.select-all")) updateCount();
  });

  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.elt.id === "bulk-form" && event.detail.successful) {
      document.querySelectorAll("input.select-item:checked, input.select-all").forEach(function (box) {
        box.checked = false;
      });
      updateCount();
    }
  });

  // ---------------------------------------------------------------- the keyboard
  let current = null; // the focused item's approval id (survives the list's refreshes)

  function cards() {
    return Array.from(document.querySelectorAll("article.card[data-approval]"));
  }

  function currentCard() {
    return current ? document.getElementById("approval-" + current) : null;
  }

  function focusCard(card) {
    cards().forEach(function (c) { c.classList.remove("focused"); });
    if (!card) { current = null; return; }
    current = card.dataset.approval;
    card.classList.add("focused");
    card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    const list = cards();
    if (!list.length) return;
    const at = list.indexOf(currentCard());
    const next = at < 0 ? (step > 0 ? 0 : list.length - 1) : Math.min(list.length - 1, Math.max(0, at + step));
    focusCard(list[next]);
  }

  document.addEventListener("htmx:afterSettle", function () {
    // the list was re-rendered: keep the focus mark on the same item (or the next one)
    const card = currentCard();
    if (card) card.classList.add("focused");
    updateCount();
  });

  function help() {
    const dialog = document.getElementById("shortcut-help");
    if (!dialog) return;
    if (dialog.open) dialog.close(); else dialog.showModal();
  }

  document.addEventListener("click", function (event) {
    if (event.target.closest(".help-open")) help();
    const card = event.target.closest("article.card[data-approval]");
    if (card && !event.target.closest("a, button, input, select, textarea, summary")) focusCard(card);
  });

  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable=true]") !== null;
  }

  // Enter in a reason field after "r" rejects (a plain Enter would submit the first button)
  document.addEventListener("keydown", function (event) {
    const field = event.target;
    if (event.key === "Escape" && typing(field)) {
      const form = field.closest("form.decide");
      if (form) delete form.dataset.intent;
      field.blur();
      const card = field.closest("article.card");
      if (card) focusCard(card);
      return;
    }
    if (event.key === "Enter" && field.matches("form.decide input[name=reason], form.decide input[name=internal_note]")) {
      const form = field.closest("form.decide");
      if (form.dataset.intent === "reject") {
        event.preventDefault();
        delete form.dataset.intent;
        form.querySelector("button[value=reject]").click();
      }
    }
  });

  const KEYS = {
    j: function () { move(1); },
    k: function () { move(-1); },
    a: function (card) { click(card, "form.decide button[value=approve]"); },
    r: function (card) {
      const form = card.querySelector("form.decide");
      const reason = form && form.querySelector("input[name=reason]");
      if (!reason || !form.querySelector("button[value=reject]")) return;
      form.dataset.intent = "reject";
      reason.focus();
    },
    e: function (card) {
      const details = card.querySelector("details.edit");
      if (!details) return;
      details.open = true;
      const first = details.querySelector("input:not([type=hidden]), select, textarea");
      if (first) first.focus();
    },
    c: function (card) { click(card, ".claim-button"); },
    x: function (card) {
      const box = card.querySelector("input.select-item");
      if (box) { box.checked = !box.checked; updateCount(); }
    },
  };

  function click(card, selector) {
    const target = card.querySelector(selector);
    if (target) target.click();
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const dialog = document.getElementById("shortcut-help");
    if (event.key === "?") { event.preventDefault(); help(); return; }
    if (dialog && dialog.open) return;
    const action = KEYS[event.key];
    if (!action) return;
    event.preventDefault();
    const card = currentCard();
    if (!card && event.key !== "j" && event.key !== "k") {
      move(1); // nothing acts on an item the person has not seen marked: mark the first one
      return;
    }
    action(card);
  });
})();
