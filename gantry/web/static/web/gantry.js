// Gantry's pages: refresh the live part of a page, follow a run's log, small form helpers. No library.
(function () {
  "use strict";

  // <div data-live="URL" data-every="S">: fetch URL every S seconds and swap the contents in place.
  function live(el) {
    var every = Math.max(1, parseFloat(el.getAttribute("data-every") || "5")) * 1000;
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch(el.getAttribute("data-live"), { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) { el.innerHTML = html; el.dispatchEvent(new Event("gantry:updated")); } })
        .catch(function () {})
        .finally(function () { busy = false; });
    }, every);
  }

  // A run's log (<pre data-log>) is followed by logview.js, loaded by the run page.

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(live);
    var pick = document.querySelector("[data-orgpick-select]");
    if (pick) pick.addEventListener("change", function () { window.location = pick.value; });
  });

  // Forms that ask first (rotate a token). Delegated: live parts are re-rendered.
  document.addEventListener("submit", function (ev) {
    var msg = ev.target.getAttribute && ev.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });

  confirmButtons();

  // <button data-confirm="question">: ask first; a "no" stops the click (and so the form's submit). Delegated.
  function confirmButtons() {
    document.addEventListener("click", function (ev) {
      var button = ev.target.closest && ev.target.closest("button[data-confirm]");
      if (button && !window.confirm(button.getAttribute("data-confirm"))) ev.preventDefault();
    }, true);
  }
})();
