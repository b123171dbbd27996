// Gantry's pages: refresh the live part of a page, follow a run's log, local times, confirmations. No library.
(function () {
  "use strict";

  // Whether a person has started filling in a form of the live part (a select moved, a field typed in): the
  // swap would put the form back as it was drawn, so it waits until they send it or put it back.
  function editing(el) {
    var fields = el.querySelectorAll("select, input, textarea"), i, j, f;
    for (i = 0; i < fields.length; i++) {
      f = fields[i];
      if (f.tagName === "SELECT") {
        for (j = 0; j < f.options.length; j++) if (f.options[j].selected !== f.options[j].defaultSelected) return true;
      } else if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) return true;
      } else if (f.type !== "hidden" && f.value !== f.defaultValue) return true;
    }
    return false;
  }

  // <div data-live="URL" data-every="S">: fetch URL every S seconds and swap the contents in place.
  function live(el) {
    var every = Math.max(1, parseFloat(el.getAttribute("data-every") || "5")) * 1000;
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden || editing(el)) return;
      busy = true;
      fetch(el.getAttribute("data-live"), { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html !== null) { el.innerHTML = html; localTimes(el); el.dispatchEvent(new Event("gantry:updated", { bubbles: true })); }
        })
        .catch(function () {})
        .finally(function () { busy = false; });
    }, every);
  }

  // A run's log (<pre data-log>) is followed by logview.js, loaded by the run page.

  // <time datetime="ISO">: the browser's local time and a relative form ("3 min ago", "in 59 min"); the exact
  // UTC time on hover (title). The server writes UTC text, so without this script the page still tells the truth.
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function relative(ms) {
    var s = Math.round(Math.abs(ms) / 1000), text;
    if (s < 5) return "just now";
    if (s < 120) text = s + " s";
    else if (s < 3600) text = Math.floor(s / 60) + " min";
    else if (s < 86400) text = Math.floor(s / 3600) + " h" + (s % 3600 >= 60 ? " " + Math.floor(s % 3600 / 60) + " min" : "");
    else text = Math.floor(s / 86400) + " d" + (s % 86400 >= 3600 ? " " + Math.floor(s % 86400 / 3600) + " h" : "");
    return ms < 0 ? "in " + text : text + " ago";
  }
  function localTimes(root) {
    var now = Date.now();
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) return;
      var precise = el.hasAttribute("data-precise");
      var local = at.getFullYear() + "-" + pad(at.getMonth() + 1) + "-" + pad(at.getDate()) + " " +
        pad(at.getHours()) + ":" + pad(at.getMinutes()) + (precise ? ":" + pad(at.getSeconds()) : "");
      el.textContent = local + " (" + relative(now - at.getTime()) + ")";
      el.title = at.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
      el.setAttribute("data-local", "1");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(live);
    var pick = document.querySelector("[data-orgpick-select]");
    if (pick) pick.addEventListener("change", function () { window.location = pick.value; });
    localTimes(document);
    // Relative forms age: refresh them twice a minute even where nothing is live.
    setInterval(function () { localTimes(document); }, 30000);
  });

  confirmButtons();
})();

// <button data-confirm="question">: ask first, on every page; "no" cancels the submit. Delegated on the document,
// so buttons in live parts (re-rendered every few seconds) are covered too.
function confirmButtons() {
  "use strict";
  document.addEventListener("click", function (ev) {
    var button = ev.target.closest && ev.target.closest("button[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) { ev.preventDefault(); ev.stopImmediatePropagation(); }
  }, true);
}
