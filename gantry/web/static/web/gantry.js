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

  // <pre data-log="/api/v1/runs/ID/logs">: follow the log with ?offset= until it is complete.
  function followLog(pre) {
    var url = pre.getAttribute("data-log");
    var state = document.querySelector("[data-log-state]");
    var offset = 0;
    function tick() {
      fetch(url + "?offset=" + offset, { credentials: "same-origin" })
        .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
        .then(function (page) {
          if (page.text) {
            var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
            pre.appendChild(document.createTextNode(page.text));
            if (atEnd) pre.scrollTop = pre.scrollHeight;
          }
          offset = page.next_offset;
          if (page.complete) {
            if (state) state.textContent = offset ? "End of log." : "No output.";
            return;
          }
          if (state) state.textContent = "Following the log live…";
          setTimeout(tick, page.text ? 300 : 1500);
        })
        .catch(function (e) {
          if (state) state.textContent = "Log unavailable (" + e.message + "); retrying.";
          setTimeout(tick, 3000);
        });
    }
    tick();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(live);
    document.querySelectorAll("pre[data-log]").forEach(followLog);
    var pick = document.querySelector("[data-orgpick-select]");
    if (pick) pick.addEventListener("change", function () { window.location = pick.value; });
  });

  // <button data-confirm="question">: ask before the button's form is sent (delegated: live parts are re-rendered).
  function confirmButtons(ev) {
    var button = ev.target.closest && ev.target.closest("button[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) ev.preventDefault();
  }
  document.addEventListener("click", confirmButtons);

  // Forms that ask first (rotate a token). Delegated: live parts are re-rendered.
  document.addEventListener("submit", function (ev) {
    var msg = ev.target.getAttribute && ev.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });
})();
