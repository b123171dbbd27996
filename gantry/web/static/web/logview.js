// Gantry's log viewer (docs/logs.md, "The viewer"): follows a run's log through the read API and shows it as
// numbered lines with the time each was written, ANSI colours, and the runner's steps as collapsible sections.
// The log is untrusted: it only ever becomes text nodes and class names chosen here, never HTML.
(function () {
  "use strict";

  // The runner's step lines (runners/ephemeral.py): "==> [2/5] name" opens step 2, and
  // "==> [2/5] name: exit code 0 (1.2s)" or "==> [2/5] name: timed out after 60.0s (exit code 124)" closes it.
  var STEP = /^==> \[(\d+)\/(\d+)\] ?(.*)$/;
  var EXITED = /: exit code (-?\d+) \(([\d.]+)s\)$/;
  var STOPPED = /: (.+) after ([\d.]+)s \(exit code (-?\d+)\)$/;
  // Escapes that are not colours: other CSI sequences, OSC (titles, links), and two-byte ones; all dropped.
  var ESCAPES = /\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]/g;
  var SGR = /\x1b\[([0-9;:]*)m/g;
  var encoder = new TextEncoder();
  // Past this many lines the rest is shown as plain text (no numbers, times, colours or steps): a line is a few
  // DOM nodes, and a 50 MB log of short lines would be millions. Download raw has the whole log either way.
  var LINE_LIMIT = window.GANTRY_LOG_LINE_LIMIT || 50000;

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function clock(ms) {
    var d = new Date(ms);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  // ---------------------------------------------------------------- ANSI SGR

  function newStyle() { return { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false }; }

  function rgb(r, g, b) { return "rgb(" + r + "," + g + "," + b + ")"; }

  function color256(n) {
    if (n < 16) return { cls: n < 8 ? 30 + n : 82 + n };
    if (n < 232) {
      n -= 16;
      var v = function (x) { return x ? 55 + x * 40 : 0; };
      return { css: rgb(v(Math.floor(n / 36)), v(Math.floor(n / 6) % 6), v(n % 6)) };
    }
    var g = 8 + (n - 232) * 10;
    return { css: rgb(g, g, g) };
  }

  // Apply one SGR parameter list to the style (unknown codes are ignored).
  function applySgr(style, params) {
    var p = params === "" ? [0] : params.split(/[;:]/).map(function (x) { return parseInt(x || "0", 10); });
    for (var i = 0; i < p.length; i++) {
      var c = p[i];
      if (c === 0) { var fresh = newStyle(); for (var k in fresh) style[k] = fresh[k]; }
      else if (c === 1) style.bold = true;
      else if (c === 2) style.dim = true;
      else if (c === 3) style.italic = true;
      else if (c === 4) style.underline = true;
      else if (c === 22) { style.bold = false; style.dim = false; }
      else if (c === 23) style.italic = false;
      else if (c === 24) style.underline = false;
      else if ((c >= 30 && c <= 37) || (c >= 90 && c <= 97)) style.fg = { cls: c };
      else if (c === 39) style.fg = null;
      else if ((c >= 40 && c <= 47) || (c >= 100 && c <= 107)) style.bg = { cls: c - 10 };
      else if (c === 49) style.bg = null;
      else if (c === 38 || c === 48) {
        var value = null;
        if (p[i + 1] === 5 && i + 2 < p.length) { value = color256(p[i + 2] & 255); i += 2; }
        else if (p[i + 1] === 2 && i + 4 < p.length) { value = { css: rgb(p[i + 2] & 255, p[i + 3] & 255, p[i + 4] & 255) }; i += 4; }
        else i = p.length;
        if (value && value.cls && c === 48) value = { cls: value.cls };
        if (c === 38) style.fg = value; else style.bg = value;
      }
    }
  }

  function plain(style) { return !style.fg && !style.bg && !style.bold && !style.dim && !style.italic && !style.underline; }

  function span(text, style) {
    if (plain(style)) return document.createTextNode(text);
    var s = document.createElement("span");
    var cls = [];
    if (style.fg && style.fg.cls) cls.push("a-fg" + style.fg.cls);
    if (style.bg && style.bg.cls) cls.push("a-bg" + style.bg.cls);
    if (style.bold) cls.push("a-b");
    if (style.dim) cls.push("a-d");
    if (style.italic) cls.push("a-i");
    if (style.underline) cls.push("a-u");
    if (cls.length) s.className = cls.join(" ");
    if (style.fg && style.fg.css) s.style.color = style.fg.css;
    if (style.bg && style.bg.css) s.style.backgroundColor = style.bg.css;
    s.textContent = text;
    return s;
  }

  // A line's text as nodes: SGR runs become spans, other escapes go; the style carries on to the next line.
  function render(text, style, into) {
    var last = 0;
    var m;
    SGR.lastIndex = 0;
    while ((m = SGR.exec(text)) !== null) {
      var piece = text.slice(last, m.index).replace(ESCAPES, "");
      if (piece) into.appendChild(span(piece, style));
      applySgr(style, m[1]);
      last = SGR.lastIndex;
    }
    var rest = text.slice(last).replace(ESCAPES, "");
    if (rest) into.appendChild(span(rest, style));
  }

  function strip(text) { return text.replace(SGR, "").replace(ESCAPES, ""); }

  // A progress bar's carriage returns: a terminal shows what was written after the last one.
  function overwritten(text) {
    var cut = text.lastIndexOf("\r");
    return cut < 0 ? text : text.slice(cut + 1);
  }

  // ---------------------------------------------------------------- the viewer

  function Viewer(pre) {
    this.pre = pre;
    this.url = pre.getAttribute("data-log");
    this.state = document.querySelector("[data-log-state]");
    this.offset = 0;          // bytes read so far (the API's offsets are bytes)
    this.lineStart = 0;       // byte offset where the open (unfinished) line starts
    this.partial = "";        // the open line's text so far
    this.openLine = null;     // its element, re-rendered as it grows
    this.openStyle = null;    // the style at the open line's start
    this.style = newStyle();  // the style after the last finished line
    this.count = 0;
    this.times = [];          // [byte offset, ms], ascending: when the runner wrote each block
    this.step = null;         // the open step: {n, label, details, summary, body}
    this.plain = null;        // the text node past LINE_LIMIT lines
    this.wantHash = /^#L\d+$/.test(window.location.hash);  // a #L123 not reached yet (no auto-scroll until then)
  }

  Viewer.prototype.timeAt = function (offset) {
    var t = this.times, lo = 0, hi = t.length - 1, best = null;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (t[mid][0] <= offset) { best = t[mid][1]; lo = mid + 1; } else hi = mid - 1;
    }
    return best;
  };

  Viewer.prototype.container = function () { return this.step ? this.step.body : this.pre; };

  Viewer.prototype.lineElement = function (n, offset) {
    var el = document.createElement("span");
    el.className = "line";
    el.id = "L" + n;
    var a = document.createElement("a");
    a.className = "no";
    a.href = "#L" + n;
    a.setAttribute("data-n", String(n));
    a.setAttribute("aria-label", "line " + n);
    el.appendChild(a);
    var ms = this.timeAt(offset);
    var ts = document.createElement("span");
    ts.className = "ts";
    if (ms !== null) {
      ts.setAttribute("data-ts", clock(ms));
      ts.title = new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    }
    el.appendChild(ts);
    return el;
  };

  // Fill a line element with its text (the final "\n" kept, so the log's text content is the log).
  Viewer.prototype.fill = function (el, text, style, ended) {
    while (el.childNodes.length > 2) el.removeChild(el.lastChild);
    var body = document.createElement("span");
    body.className = "tx";
    render(overwritten(text.replace(/\r+$/, "")), style, body);
    if (ended) {
      var nl = document.createElement("span");
      nl.className = "nl";
      nl.textContent = "\n";
      body.appendChild(nl);
    }
    el.appendChild(body);
  };

  // A finished line: a step header opens a section, a step footer closes it, anything else is a line.
  Viewer.prototype.finishLine = function (text, offset) {
    var n = ++this.count;
    var el = this.openLine || this.lineElement(n, offset);
    this.openLine = null;
    var style = this.openStyle || this.style;
    this.openStyle = null;
    var bare = strip(text).replace(/\r+$/, "");
    var m = STEP.exec(bare);
    var closes = m && this.step && m[1] === this.step.n && bare.indexOf(this.step.head + ":") === 0;
    if (m && !closes && !(this.step && m[1] === this.step.n)) {
      if (el.parentNode) el.parentNode.removeChild(el);
      this.openStep(m, bare);
      this.fill(el, text, style, true);
      this.step.summary.appendChild(el);
    } else {
      this.fill(el, text, style, true);
      if (!el.parentNode) this.container().appendChild(el);
      if (closes) this.closeStep(bare);
    }
    this.style = style;
  };

  Viewer.prototype.openStep = function (m, bare) {
    var details = document.createElement("details");
    details.className = "step";
    details.open = true;
    details.setAttribute("data-step", m[1]);
    var summary = document.createElement("summary");
    summary.setAttribute("data-badge", "running");
    var body = document.createElement("div");
    body.className = "stepbody";
    details.appendChild(summary);
    details.appendChild(body);
    this.pre.appendChild(details);
    this.step = { n: m[1], head: bare, details: details, summary: summary, body: body };
  };

  Viewer.prototype.closeStep = function (bare) {
    var s = this.step, code = null, secs = null, why = "exited", m;
    if ((m = EXITED.exec(bare))) { code = m[1]; secs = m[2]; }
    else if ((m = STOPPED.exec(bare))) { why = m[1]; secs = m[2]; code = m[3]; }
    else why = bare.slice(s.head.length + 2);
    if (code !== null) s.details.setAttribute("data-exit", code);
    if (secs !== null) s.details.setAttribute("data-duration", secs);
    s.details.classList.add(code === "0" ? "ok" : "bad");
    var badge = [];
    if (why !== "exited") badge.push(why);
    if (code !== null) badge.push("exit " + code);
    if (secs !== null) badge.push(duration(parseFloat(secs)));
    s.summary.setAttribute("data-badge", badge.join(" · "));
    this.step = null;
  };

  function duration(s) {
    if (s < 60) return s.toFixed(1) + " s";
    var m = Math.floor(s / 60);
    if (m < 60) return m + " min " + Math.round(s - m * 60) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " min";
  }

  // New text from the API, starting at byte offset `at`.
  Viewer.prototype.append = function (text, at) {
    var atEnd = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 8;
    var pos = 0, offset = this.lineStart;
    var all = this.partial + text;
    if (this.plain) { this.plain.appendData(strip(text)); return this.followScroll(atEnd); }
    while (true) {
      var nl = all.indexOf("\n", pos);
      if (nl < 0) break;
      if (this.count >= LINE_LIMIT) { this.goPlain(all.slice(pos)); return this.followScroll(atEnd); }
      var line = all.slice(pos, nl);
      this.finishLine(line, offset);
      offset += encoder.encode(line).length + 1;
      pos = nl + 1;
    }
    this.partial = all.slice(pos);
    this.lineStart = offset;
    if (this.partial) {
      // The runner has not finished this line yet: show it, and redraw it as it grows.
      if (!this.openLine) {
        this.openLine = this.lineElement(this.count + 1, offset);
        this.openStyle = { fg: this.style.fg, bg: this.style.bg, bold: this.style.bold, dim: this.style.dim,
                           italic: this.style.italic, underline: this.style.underline };
        this.container().appendChild(this.openLine);
      }
      var copy = {};
      for (var k in this.openStyle) copy[k] = this.openStyle[k];
      this.fill(this.openLine, this.partial, copy, false);
    }
    this.followScroll(atEnd);
    this.showHash(false);
  };

  Viewer.prototype.followScroll = function (atEnd) {
    if (atEnd && !this.wantHash) this.pre.scrollTop = this.pre.scrollHeight;
  };

  // Too many lines to lay out one by one: the rest of the log goes in as one plain text node.
  Viewer.prototype.goPlain = function (rest) {
    if (this.openLine && this.openLine.parentNode) this.openLine.parentNode.removeChild(this.openLine);
    this.openLine = null;
    this.partial = "";
    this.step = null;
    var note = document.createElement("span");
    note.className = "viewer-note";
    note.setAttribute("data-plain-from", String(this.count + 1));
    note.textContent = "[viewer: the log goes on past " + LINE_LIMIT.toLocaleString("en") +
      " lines; the rest is shown as plain text (Download raw for the file)]\n";
    this.pre.appendChild(note);
    this.plain = document.createTextNode(strip(rest));
    this.pre.appendChild(this.plain);
  };

  // #L123: highlight that line, open its step, scroll to it (once it has arrived).
  Viewer.prototype.showHash = function (force) {
    var m = /^#L(\d+)$/.exec(window.location.hash);
    if (!m || (!force && !this.wantHash)) return;
    var el = document.getElementById("L" + m[1]);
    if (!el) return;
    this.wantHash = false;
    this.pre.querySelectorAll(".line.hl").forEach(function (x) { x.classList.remove("hl"); });
    el.classList.add("hl");
    for (var p = el.parentNode; p && p !== this.pre; p = p.parentNode) if (p.tagName === "DETAILS") p.open = true;
    el.scrollIntoView({ block: "center" });
  };

  Viewer.prototype.say = function (text) { if (this.state) this.state.textContent = text; };

  // Follows by long poll: the server holds an empty answer until the runner pushes (docs/logs.md, `wait`).
  var WAIT_S = 25;
  // An empty answer that came back sooner than this was not held (a server without the event loop's wait,
  // or Redis away): pause as the timer-driven viewer did rather than ask again at once.
  var HELD_MS = 1000;

  Viewer.prototype.follow = function () {
    var self = this;
    function tick() {
      var asked = Date.now();
      fetch(self.url + "?times=1&wait=" + WAIT_S + "&offset=" + self.offset, { credentials: "same-origin" })
        .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
        .then(function (page) {
          if (page.times && page.times.length) {
            var last = self.times.length ? self.times[self.times.length - 1][0] : -1;
            page.times.forEach(function (t) { if (t[0] > last) { self.times.push(t); last = t[0]; } });
          }
          if (page.text) self.append(page.text, self.offset);
          self.offset = page.next_offset;
          if (page.final) {
            if (self.partial && !self.plain) { self.finishLastLine(); }
            self.say(!self.offset ? "No output." : page.complete ? "End of log." : "End of log (output was lost; see its last line).");
            self.showHash(false);
            return;
          }
          // A silent runner pushes nothing: say so rather than "following" a log that cannot move.
          self.say(document.querySelector("[data-runner-silent]")
            ? "The runner is silent: the log stops where it last pushed (still checking for more)."
            : "Following the log live…");
          setTimeout(tick, page.text || Date.now() - asked >= HELD_MS ? 0 : 1500);
        })
        .catch(function (e) {
          self.say("Log unavailable (" + e.message + "); retrying.");
          setTimeout(tick, 3000);
        });
    }
    tick();
  };

  // The log ended without a final newline: that last line is finished all the same.
  Viewer.prototype.finishLastLine = function () {
    var text = this.partial;
    this.partial = "";
    this.finishLine(text, this.lineStart);
    var el = document.getElementById("L" + this.count);
    var nl = el && el.querySelector(".nl");
    if (nl) nl.parentNode.removeChild(nl);
  };

  document.addEventListener("DOMContentLoaded", function () {
    var pre = document.querySelector("pre[data-log]");
    var live = document.querySelector("[data-live]");
    if (live) {
      // A waiting run's page has no log box: once a runner starts it, load the page with one.
      live.addEventListener("gantry:updated", function () {
        var head = live.querySelector("[data-has-log]");
        if (!pre && head && head.getAttribute("data-has-log") === "1") window.location.reload();
      });
    }
    if (!pre) return;
    var viewer = new Viewer(pre);
    window.addEventListener("hashchange", function () { viewer.showHash(true); });
    var toggle = document.querySelector("[data-log-times]");
    if (toggle) toggle.addEventListener("change", function () { pre.classList.toggle("notimes", !toggle.checked); });
    viewer.follow();
  });
})();
