// huddle room page: live updates from the room's event stream. No library; every
// piece of ledger text is inserted with textContent, never as HTML.
(function () {
  "use strict";
  var root = document.getElementById("room");
  if (!root) return;
  var room = root.dataset.room;
  var base = "/rooms/" + encodeURIComponent(room);
  var list = document.getElementById("timeline-list");
  var conn = document.getElementById("conn");
  var view = null; // the DAG's viewBox [x, y, w, h], kept across refreshes

  function time(us) {
    return new Date(Math.floor(us / 1000)).toISOString().replace("T", " ").slice(0, 23);
  }
  function span(cls, text) {
    var s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    return s;
  }
  function kind(row) {
    var text = row.body && typeof row.body.text === "string" ? row.body.text : null;
    if (row.verb === "message.posted") {
      if (row.role === "owner" && text !== null && text.trim().charAt(0) === "!") return "command";
      if (row.role === "system") return "answer";
      return "message";
    }
    if (row.verb === "turn.progress") return "progress";
    return "bookkeeping";
  }
  function summary(body) {
    if (!body || typeof body !== "object") return JSON.stringify(body);
    return Object.keys(body).sort().map(function (k) {
      var v = body[k];
      if (v !== null && typeof v === "object") v = Array.isArray(v) ? "[" + v.length + " items]" : "{…}";
      v = String(v);
      if (v.length > 100) v = v.slice(0, 100) + "…";
      return k + "=" + v;
    }).join(" ");
  }
  function cursorOf(row) {
    return row.position.major + ":" + row.position.minor;
  }

  function addRow(row) {
    var k = kind(row);
    var top = list.firstElementChild;
    if (k === "bookkeeping" && top && top.dataset.live === "bookkeeping") {
      var counts = top._counts;
      counts[row.verb] = (counts[row.verb] || 0) + 1;
      top._n += 1;
      top.querySelector(".text").textContent = top._n + " bookkeeping: " + Object.keys(counts).sort().map(function (v) {
        return counts[v] === 1 ? v : v + " ×" + counts[v];
      }).join(", ");
      top.dataset.cursor = cursorOf(row);
      return;
    }
    var li = document.createElement("li");
    li.className = "row " + k;
    li.dataset.cursor = cursorOf(row);
    if (k !== "bookkeeping") {
      li.dataset.thread = row.thread || "";
      if (row.thread) addThread(row.thread);
    }
    var t = document.createElement("time");
    t.textContent = time(row.at);
    li.appendChild(t);
    li.appendChild(document.createTextNode(" "));
    if (k === "bookkeeping") {
      li.dataset.live = "bookkeeping";
      li._counts = {};
      li._counts[row.verb] = 1;
      li._n = 1;
      li.appendChild(span("text", "1 bookkeeping: " + row.verb));
    } else {
      if (row.thread) {
        li.appendChild(span("thread", "#" + row.thread));
        li.appendChild(document.createTextNode(" "));
      }
      li.appendChild(span("actor", row.actor));
      li.appendChild(document.createTextNode(" "));
      li.appendChild(span("role", "(" + row.role + ")"));
      li.appendChild(document.createTextNode(" "));
      var text = row.body && typeof row.body.text === "string" ? row.body.text : summary(row.body);
      li.appendChild(span("text", text));
    }
    list.insertBefore(li, list.firstChild);
    show(li);
  }

  // The thread filter: every thread, the room's top level, or one thread (its
  // messages and replies; bookkeeping lines only under "every thread").
  var filter = document.getElementById("thread-filter");
  function show(li) {
    var want = filter ? filter.value : "*";
    li.hidden = !(want === "*" || li.dataset.thread === want);
  }
  function addThread(t) {
    if (!filter) return;
    for (var i = 0; i < filter.options.length; i++) if (filter.options[i].value === t) return;
    var o = document.createElement("option");
    o.value = t;
    o.textContent = "#" + t;
    filter.appendChild(o);
  }
  if (filter) filter.addEventListener("change", function () {
    Array.prototype.forEach.call(list.children, show);
  });

  // The board/DAG/claims fragment, fetched again (at most one fetch at a time, and
  // once more if something changed during it) when events arrive.
  var timer = null, fetching = false, again = false;
  function schedule() {
    if (fetching) { again = true; return; }
    if (timer === null) timer = setTimeout(refresh, 200);
  }
  function refresh() {
    timer = null;
    fetching = true;
    fetch(base + "/live", { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.text();
    }).then(function (html) {
      // Server-rendered, every ledger string escaped there.
      document.getElementById("live").innerHTML = html;
      setupDag();
      stamp = Date.now();
      watchLeases();
    }).catch(function () {}).then(function () {
      fetching = false;
      if (again) { again = false; schedule(); }
    });
  }

  // Pan and zoom on the DAG's viewBox.
  function setupDag() {
    var svg = document.getElementById("dag");
    if (!svg) return;
    var w = +svg.dataset.width, h = +svg.dataset.height;
    if (!view) view = [0, 0, w, h];
    function apply() { svg.setAttribute("viewBox", view.join(" ")); }
    apply();
    svg.addEventListener("wheel", function (e) {
      e.preventDefault();
      var r = svg.getBoundingClientRect();
      var fx = (e.clientX - r.left) / r.width, fy = (e.clientY - r.top) / r.height;
      var s = e.deltaY > 0 ? 1.15 : 1 / 1.15;
      var nw = Math.max(50, Math.min(w * 4, view[2] * s)), nh = view[3] * (nw / view[2]);
      view = [view[0] + (view[2] - nw) * fx, view[1] + (view[3] - nh) * fy, nw, nh];
      apply();
    }, { passive: false });
    var drag = null;
    svg.addEventListener("pointerdown", function (e) {
      drag = { x: e.clientX, y: e.clientY, v: view.slice() };
      svg.setPointerCapture(e.pointerId);
    });
    svg.addEventListener("pointermove", function (e) {
      if (!drag) return;
      var r = svg.getBoundingClientRect();
      view = [drag.v[0] - (e.clientX - drag.x) * view[2] / r.width,
              drag.v[1] - (e.clientY - drag.y) * view[3] / r.height, view[2], view[3]];
      apply();
    });
    svg.addEventListener("pointerup", function () { drag = null; });
  }

  // Claims count down between refreshes (from the database clock of the render).
  var stamp = Date.now();
  setInterval(function () {
    var box = document.getElementById("claims");
    if (!box) return;
    var now = +box.dataset.now + (Date.now() - stamp) * 1000;
    box.querySelectorAll("td.left").forEach(function (td) {
      var left = Math.max(0, (+td.dataset.expires - now) / 1e6);
      td.textContent = left > 0 ? left.toFixed(1) + " s" : "lapsed";
    });
  }, 1000);

  // A lapsing lease changes no row (so sends no event) but changes the page: an
  // agent goes offline, a claim is up for grabs. Fetch the fragment again when the
  // first lease it shows would lapse.
  var leaseTimer = null;
  function watchLeases() {
    if (leaseTimer !== null) clearTimeout(leaseTimer);
    leaseTimer = null;
    var box = document.getElementById("claims");
    if (!box) return;
    var now = +box.dataset.now, first = Infinity;
    document.querySelectorAll("#live [data-expires]").forEach(function (el) {
      var at = +el.dataset.expires;
      if (at > now && at < first) first = at;
    });
    if (first === Infinity) return;
    var wait = Math.min(60000, Math.max(1000, (first - now) / 1000 + 300));
    leaseTimer = setTimeout(schedule, wait);
  }

  // The owner's post box (only on servers started with --owner, in rooms the owner
  // owns): posts with the page's token, shows huddle's answer to a command as text.
  var form = document.getElementById("post-form");
  if (form) {
    var box = document.getElementById("post-text");
    var threadBox = document.getElementById("post-thread");
    var send = document.getElementById("post-send");
    var status = document.getElementById("post-status");
    var answer = document.getElementById("post-answer");
    var say = function (text, cls) {
      status.textContent = text;
      status.className = "post-status " + (cls || "");
    };
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var text = box.value;
      if (!text.trim()) { say("nothing to post", "error"); return; }
      var body = { text: text };
      if (threadBox && threadBox.value.trim()) body.thread = threadBox.value.trim();
      var command = text.trim().charAt(0) === "!";
      send.disabled = true;
      answer.hidden = true;
      say(command ? "posting; waiting for huddle's answer…" : "posting…");
      fetch("/api/rooms/" + encodeURIComponent(room) + "/messages", {
        method: "POST",
        cache: "no-store",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Huddle-Token": form.dataset.token },
        body: JSON.stringify(body)
      }).then(function (r) {
        return r.json().catch(function () { return { error: "HTTP " + r.status }; })
          .then(function (v) { return { ok: r.ok, v: v }; });
      }).then(function (res) {
        var v = res.v || {};
        if (!res.ok) { say(v.error || "not posted", "error"); return; }
        box.value = "";
        document.body.dataset.posted = v.id || "";
        if (v.answer) {
          var a = v.answer;
          var said = a.body && typeof a.body.text === "string" ? a.body.text : summary(a.body);
          answer.textContent = a.actor + " (" + a.role + "): " + said;
          answer.hidden = false;
          say("posted; answered", "ok");
        } else {
          say(v.note ? "posted; " + v.note : "posted", v.note ? "warn" : "ok");
        }
      }).catch(function (err) {
        say("not posted: " + err, "error");
      }).then(function () {
        send.disabled = false;
      });
    });
    box.addEventListener("keydown", function (e) {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        if (typeof form.requestSubmit === "function") form.requestSubmit(); else send.click();
      }
    });
  }

  setupDag();
  watchLeases();
  var es = new EventSource("/api/rooms/" + encodeURIComponent(room) + "/events?after=" +
    encodeURIComponent(root.dataset.cursor));
  es.onopen = function () {
    conn.textContent = "live";
    conn.className = "conn open";
    document.body.dataset.sse = "open";
  };
  es.onerror = function () {
    conn.textContent = "reconnecting…";
    conn.className = "conn closed";
    document.body.dataset.sse = "reconnecting";
  };
  es.addEventListener("interaction", function (e) {
    try { addRow(JSON.parse(e.data)); } catch (err) { /* a row this page cannot show */ }
    document.body.dataset.lastEventId = e.lastEventId;
    schedule();
  });
  es.addEventListener("skipped", function (e) {
    document.body.dataset.lastEventId = e.lastEventId;
  });
})();
