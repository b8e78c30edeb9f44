// Loaded on every page. The Content Security Policy allows our static scripts only (no inline
// script, no eval), so behaviour that would otherwise sit in attributes lives here.

// The inbox's list poll sends the signature of what it shows, so an unchanged list answers 204
// (was hx-vals="js:...", which htmx evaluates with eval).
document.addEventListener("htmx:configRequest", function (event) {
  if (event.detail.elt.id !== "inbox-items") return;
  const state = document.getElementById("inbox-state");
  event.detail.parameters.sig = (state && state.dataset.signature) || "";
});
