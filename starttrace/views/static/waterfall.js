/* starttrace waterfall: one canvas for all spans (no DOM node per span), DOM only for lane
   labels, the tooltip and the lazily built import tree. Every text taken from span data is set
   with textContent, never parsed as HTML. */
(function () {
  "use strict";

  var PHASE_COLORS = {
    interpreter: "#9aa5b1", "import": "#4e79a7", forkserver: "#b07aa1", forkserver_preload: "#d4a6c8",
    launch: "#f28e2b", fork: "#ff9d9a", bootstrap: "#edc948", cuda_init: "#e15759", dist_init: "#76b7b2",
    model_load: "#59a14f", compile: "#8cd17d", kv_cache: "#b6992d", cuda_graphs: "#499894",
    ready: "#2ca02c", other: "#bab0ac",
    api_server: "#86bcb6", config: "#d7b5a6", engine_init: "#9c755f", executor_init: "#f1ce63", worker_init: "#a0cbe8", device_init: "#fabfd2", server_startup: "#79706e", idle: "#e8e8e8",
    wait: "#c7c7c7", unexplained: "#f0f0f0",
    tokenizer: "#ffbe7d", first_request: "#d37295"
  };
  var AXIS_H = 26, LANE_H = 26, ROW_H = 15, MAX_ROWS = 60;
  var F_PROGRESS = 1, F_INSTANT = 2, F_ERROR = 4;
  // row fields: [id, parent, name, phase, start_us, end_us, depth, flags, attrs, pos]; parent and
  // pos are positions in the lane's full span list (the first answer holds only part of a big
  // run's spans: lanes not `complete` fetch the rest when opened or zoomed into)
  var DETAIL_DELAY_MS = 150;

  var app = document.getElementById("app");
  if (!app) { return; }
  var jsonUrl = app.getAttribute("data-json-url");
  var canvas = document.getElementById("wf-canvas");
  var wrap = document.getElementById("canvas-wrap");
  var labelsEl = document.getElementById("lane-labels");
  var tooltip = document.getElementById("tooltip");
  var ctx = canvas.getContext("2d");

  var data = null, lanes = [], fetchedAt = 0, totalUs = 1;
  var view = { t0: 0, t1: 1 }, userZoomed = false;
  var expanded = {}, selectedLane = -1;
  // short helpers folded into one row per group under their parent (data.folded; the JSON keeps
  // every lane): display rows are lanes ({lane: i}) and groups ({group: g}); a click opens a group
  var groups = [], groupOf = {}, groupOpen = {}, display = [], pathOn = false;
  var drag = null, rafPending = false, refreshTimer = null, animTimer = null, detailTimer = null;
  var laneUrl = app.getAttribute("data-lane-url");
  var detailFetches = 0;

  function phaseColor(phase) {
    if (PHASE_COLORS[phase]) { return PHASE_COLORS[phase]; }
    var h = 0;
    for (var i = 0; i < phase.length; i++) { h = (h * 31 + phase.charCodeAt(i)) % 360; }
    return "hsl(" + h + ",45%,58%)";
  }

  // an axis label that fits its scale: "10 s", "2.5 s", "250 ms", "40 µs"
  function fmtAxis(us, stepUs) {
    var digits;
    if (stepUs >= 1e6) {
      digits = Math.max(0, Math.min(3, -Math.floor(Math.log10(stepUs / 1e6) + 1e-9)));
      return (us / 1e6).toFixed(digits) + " s";
    }
    if (stepUs >= 1e3) {
      digits = Math.max(0, Math.min(3, -Math.floor(Math.log10(stepUs / 1e3) + 1e-9)));
      return (us / 1e3).toFixed(digits) + " ms";
    }
    return Math.round(us) + " µs";
  }

  function fmtDur(us) {
    if (us === null || us === undefined) { return "–"; }
    if (us >= 1e6) { return (us / 1e6).toFixed(3) + " s"; }
    if (us >= 1e3) { return (us / 1e3).toFixed(2) + " ms"; }
    return Math.round(us) + " µs";
  }

  function nowUs() {
    if (!data) { return 0; }
    var base = (data.now_ns - data.start_ns) / 1000;
    if (data.live) { base += (performance.now() - fetchedAt) * 1000; }
    return base;
  }

  function spanEnd(s) {
    if (s[5] !== null) { return s[5]; }
    return data.live ? nowUs() : totalUs;
  }

  // ------------------------------------------------------------------ data preparation
  function prepare(json) {
    data = json;
    fetchedAt = performance.now();
    totalUs = Math.max(1, Math.round(json.duration_s * 1e6));
    lanes = json.lanes.map(function (lane) {
      var ln = { info: lane, spans: [], byPos: {}, proc: null, top: [], overlay: [], rows: [], y: 0, h: LANE_H,
                 complete: lane.complete !== false, minUs: lane.detail_min_us || 0, windows: [],
                 pending: null, whole: null };
      addRows(ln, lane.spans || []);
      return ln;
    });
    groups = json.folded || [];
    groupOf = {};
    groups.forEach(function (g, gi) { g.lanes.forEach(function (i) { groupOf[i] = gi; }); });
  }

  // the rows shown, in order: each lane that is not folded, then the groups folded under it (and,
  // for an open group, its lanes); groups without a shown parent at the end
  function displayRows() {
    var out = [], placed = {};
    function addGroups(parent) {
      groups.forEach(function (g, gi) {
        if (placed[gi] || g.parent !== parent) { return; }
        placed[gi] = true;
        out.push({ group: gi });
        if (groupOpen[gi]) { g.lanes.forEach(function (i) { if (lanes[i]) { out.push({ lane: i }); } }); }
      });
    }
    lanes.forEach(function (ln, i) {
      if (groupOf[i] !== undefined) { return; }
      out.push({ lane: i });
      addGroups(i);
    });
    groups.forEach(function (g, gi) {
      if (!placed[gi]) {
        placed[gi] = true;
        out.push({ group: gi });
        if (groupOpen[gi]) { g.lanes.forEach(function (i) { if (lanes[i]) { out.push({ lane: i }); } }); }
      }
    });
    return out;
  }

  function rowPos(s, i) { return s.length > 9 ? s[9] : i; }

  // merge rows into a lane (by position; a row seen again replaces the old one) and re-index it
  function addRows(ln, rows) {
    for (var i = 0; i < rows.length; i++) {
      var s = rows[i];
      if (s.length < 10) { s = s.concat([i]); }
      ln.byPos[s[9]] = s;
    }
    ln.spans = Object.keys(ln.byPos).map(function (k) { return ln.byPos[k]; });
    ln.spans.sort(function (a, b) { return a[9] - b[9]; });
    indexLane(ln);
  }

  function indexLane(ln) {
    var spans = ln.spans, proc = null;
    for (var i = 0; i < spans.length; i++) {
      if (spans[i][3] === "process" && spans[i][1] === -1) { proc = spans[i]; break; }
    }
    var procPos = proc ? proc[9] : -2;
    var top = [], overlay = [], rows = [], base = null;
    for (var j = 0; j < spans.length; j++) {
      var s = spans[j];
      if (s === proc || s[3] === "startup") { continue; }
      var isTop = s[1] === -1 || s[1] === procPos;
      if (isTop) {
        top.push(s);
        if (base === null || s[6] < base) { base = s[6]; }
      } else if (s[3] !== "import" && s[3] !== "other" && s[3] !== "interpreter") {
        overlay.push(s);
      }
    }
    if (base === null) { base = 0; }
    for (var k = 0; k < spans.length; k++) {
      var sp = spans[k];
      if (sp === proc || sp[3] === "startup") { continue; }
      var d = sp[6] - base - 1;  // depth `base` is the lane's own row
      if (d < 0) { continue; }
      if (d >= MAX_ROWS) { d = MAX_ROWS - 1; }
      while (rows.length <= d) { rows.push([]); }
      rows[d].push(sp);
    }
    ln.proc = proc; ln.top = top; ln.overlay = overlay; ln.rows = rows;
  }

  // ------------------------------------------------------------------ lazily fetched detail
  function fetchLane(i, params) {
    var ln = lanes[i];
    var q = [];
    Object.keys(params || {}).forEach(function (k) { q.push(k + "=" + encodeURIComponent(params[k])); });
    var url = laneUrl.replace("{lane}", String(i)) + (q.length ? "?" + q.join("&") : "");
    var version = data.version;
    detailFetches++;
    document.body.setAttribute("data-detail-fetches", String(detailFetches));
    return fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (doc) {
        if (!data || data.version !== version || lanes[i] !== ln) { return null; }  // reloaded meanwhile
        addRows(ln, doc.spans);
        if (doc.complete) { ln.complete = true; }
        return doc;
      });
  }

  // the whole lane, once (an opened lane draws every row and its import tree)
  function ensureComplete(i) {
    var ln = lanes[i];
    if (ln.complete) { return Promise.resolve(ln); }
    if (!ln.whole) {
      ln.whole = fetchLane(i, {}).then(function () {
        ln.whole = null;
        resize();
        return ln;
      }, function (err) { ln.whole = null; throw err; });
    }
    return ln.whole;
  }

  // spans that the current zoom level shows at >= 1 px and the first answer left out
  function scheduleDetail() {
    if (detailTimer) { window.clearTimeout(detailTimer); }
    detailTimer = window.setTimeout(function () { detailTimer = null; fetchDetail(); }, DETAIL_DELAY_MS);
  }

  function fetchDetail() {
    if (!data) { return; }
    var w = Math.max(1, canvas.getBoundingClientRect().width);
    var pxUs = (view.t1 - view.t0) / w;
    var lo = Math.max(0, Math.floor(view.t0)), hi = Math.ceil(view.t1);
    var top = wrap.getBoundingClientRect().top, vh = window.innerHeight;
    lanes.forEach(function (ln, i) {
      if (ln.complete || ln.pending || pxUs >= ln.minUs) { return; }
      var y = top + ln.y;
      if (y > vh || y + ln.h < 0) { return; }  // off screen: fetched when scrolled to and zoomed again
      var min = Math.floor(pxUs);
      for (var k = 0; k < ln.windows.length; k++) {
        var win = ln.windows[k];
        if (win[0] <= lo && win[1] >= hi && win[2] <= min) { return; }  // already here
      }
      ln.pending = fetchLane(i, { start_us: lo, end_us: hi, min_us: min }).then(function (doc) {
        ln.pending = null;
        if (doc) {
          ln.windows.push([lo, hi, min]);
          if (ln.windows.length > 16) { ln.windows.shift(); }
          buildLabels();
          requestDraw();
        }
      }, function () { ln.pending = null; });
    });
  }

  function layout() {
    var y = AXIS_H;
    display = displayRows();
    lanes.forEach(function (ln) { ln.visible = false; ln.y = -1e9; });
    display.forEach(function (row) {
      row.y = y;
      if (row.lane !== undefined) {
        var ln = lanes[row.lane], i = row.lane;
        ln.visible = true;
        ln.y = y;
        ln.h = expanded[i] ? LANE_H + ln.rows.length * ROW_H + 4 : LANE_H;
        row.h = ln.h;
      } else {
        row.h = LANE_H;
      }
      y += row.h;
    });
    return y + 8;
  }

  // the y of a lane's row: its own, else its folded group's
  function rowY(i) {
    if (lanes[i] && lanes[i].visible) { return lanes[i].y; }
    for (var k = 0; k < display.length; k++) {
      if (display[k].group !== undefined && display[k].group === groupOf[i]) { return display[k].y; }
    }
    return null;
  }

  // ------------------------------------------------------------------ labels
  function buildLabels() {
    while (labelsEl.firstChild) { labelsEl.removeChild(labelsEl.firstChild); }
    var spacer = document.createElement("div");
    spacer.className = "axis-spacer";
    spacer.style.height = AXIS_H + "px";
    spacer.textContent = "process";
    labelsEl.appendChild(spacer);
    display.forEach(function (row) {
      if (row.group !== undefined) { labelsEl.appendChild(groupLabel(row)); return; }
      var i = row.lane, ln = lanes[i];
      var info = ln.info;
      var el = document.createElement("div");
      el.className = "lane-label role-" + String(info.role || "process").replace(/[^a-z_]/g, "");
      if (expanded[i]) { el.className += " expanded"; }
      el.setAttribute("data-lane", String(i));
      el.setAttribute("data-role", String(info.role || ""));
      el.setAttribute("data-rank", info.rank === null ? "" : String(info.rank));
      el.setAttribute("data-pid", info.pid === null ? "" : String(info.pid));
      el.setAttribute("data-spans", String(ln.spans.length));
      el.setAttribute("data-complete", ln.complete ? "true" : "false");
      el.style.height = ln.h + "px";
      el.title = (info.command || info.label) + (info.start_method ? " [" + info.start_method + "]" : "");
      var caret = document.createElement("span");
      caret.className = "caret";
      caret.textContent = expanded[i] ? "▾" : "▸";
      var role = document.createElement("span");
      role.className = "role";
      role.textContent = info.role || "process";
      var rest = document.createElement("span");
      rest.className = "ids";
      var parts = [];
      if (info.node) {  // a run of several hosts: lanes grouped by node, its first lane marked
        parts.push(info.node);
        el.setAttribute("data-node", info.node);
        if (i === 0 || lanes[i - 1].info.node !== info.node) { el.className += " node-first"; }
      }
      if (info.rank !== null) { parts.push("rank " + info.rank); }
      if (info.pid !== null) { parts.push("pid " + info.pid); }
      rest.textContent = parts.join(" · ");
      el.appendChild(caret);
      el.appendChild(role);
      el.appendChild(rest);
      if (info.in_progress && info.in_progress.length > 1) { el.className += " has-progress"; }
      if (groupOf[i] !== undefined) { el.className += " in-group"; }
      el.addEventListener("click", function () { toggleLane(i); });
      labelsEl.appendChild(el);
    });
  }

  function groupLabel(row) {
    var g = groups[row.group];
    var el = document.createElement("div");
    el.className = "lane-label group";
    el.setAttribute("data-group", String(row.group));
    el.setAttribute("data-lanes", g.lanes.join(","));
    el.style.height = row.h + "px";
    el.title = g.text + (g.parent_label ? " (under " + g.parent_label + ")" : "") + ": click to list them";
    var caret = document.createElement("span");
    caret.className = "caret";
    caret.textContent = groupOpen[row.group] ? "▾" : "▸";
    var text = document.createElement("span");
    text.className = "ids";
    text.textContent = g.text;
    el.appendChild(caret);
    el.appendChild(text);
    el.addEventListener("click", function () { groupOpen[row.group] = !groupOpen[row.group]; resize(); });
    return el;
  }

  function toggleLane(i) {
    expanded[i] = !expanded[i];
    if (expanded[i]) { selectedLane = i; showTree(i); } else if (selectedLane === i) { hideTree(); }
    resize();
  }

  // ------------------------------------------------------------------ drawing
  function resize() {
    var h = layout();
    var w = Math.max(200, wrap.clientWidth);
    var dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    canvas.style.width = w + "px";
    canvas.style.height = h + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    buildLabels();
    draw();
  }

  function requestDraw() {
    if (rafPending) { return; }
    rafPending = true;
    window.requestAnimationFrame(function () { rafPending = false; draw(); });
  }

  function xOf(t, w) { return (t - view.t0) / (view.t1 - view.t0) * w; }

  function niceStep(rangeUs, px) {
    var target = rangeUs / Math.max(1, px / 110);
    var p = Math.pow(10, Math.floor(Math.log10(target)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (p * steps[i] >= target) { return p * steps[i]; } }
    return p * 10;
  }

  var stripe = null;
  function progressPattern() {
    if (stripe) { return stripe; }
    var c = document.createElement("canvas");
    c.width = 8; c.height = 8;
    var g = c.getContext("2d");
    g.strokeStyle = "rgba(255,255,255,0.55)";
    g.lineWidth = 2;
    g.beginPath(); g.moveTo(0, 8); g.lineTo(8, 0); g.stroke();
    stripe = ctx.createPattern(c, "repeat");
    return stripe;
  }

  function drawRow(list, y, h, w, t0, t1) {
    var lastPx = -1;
    for (var i = 0; i < list.length; i++) {
      var s = list[i];
      var st = s[4];
      if (st > t1) { break; }
      var en = spanEnd(s);
      if (en < t0) { continue; }
      var x0 = xOf(st, w), x1 = xOf(en, w);
      if (s[7] & F_INSTANT) {
        ctx.fillStyle = phaseColor(s[3]);
        ctx.beginPath();
        ctx.moveTo(x0, y); ctx.lineTo(x0 + 5, y + h / 2); ctx.lineTo(x0, y + h); ctx.lineTo(x0 - 5, y + h / 2);
        ctx.fill();
        continue;
      }
      var bw = x1 - x0;
      if (bw < 1) {
        var px = Math.floor(x0);
        if (px <= lastPx) { continue; }
        lastPx = px;
        ctx.fillStyle = phaseColor(s[3]);
        ctx.fillRect(px, y, 1, h);
        continue;
      }
      lastPx = Math.floor(x1);
      ctx.fillStyle = phaseColor(s[3]);
      var cx0 = Math.max(x0, -2), cx1 = Math.min(x1, w + 2);
      ctx.fillRect(cx0, y, cx1 - cx0, h);
      if (s[7] & F_PROGRESS) {
        ctx.fillStyle = progressPattern();
        ctx.fillRect(cx0, y, cx1 - cx0, h);
        ctx.fillStyle = "#d62728";
        ctx.fillRect(cx1 - 2, y, 2, h);
      }
      if (s[7] & F_ERROR) {
        ctx.strokeStyle = "#b00020"; ctx.lineWidth = 1.5;
        ctx.strokeRect(cx0 + 0.5, y + 0.5, Math.max(1, cx1 - cx0 - 1), h - 1);
      }
      if (bw > 40 && h >= 12) {
        ctx.save();
        ctx.beginPath(); ctx.rect(cx0, y, cx1 - cx0, h); ctx.clip();
        ctx.fillStyle = "#111";
        ctx.font = "11px system-ui, sans-serif";
        ctx.fillText(s[2], Math.max(cx0, 0) + 3, y + h - 4);
        ctx.restore();
      }
    }
  }

  // a lane's bar over its window: the innermost phase at each instant (its exclusive timeline), so
  // compile inside a busy loop reads as compile; long segments say their phase
  function paintTimeline(ln, y, h, w, t0, t1) {
    var segs = ln.info.timeline || [];
    var lastPx = -1, named = [];
    for (var k = 0; k < segs.length; k++) {
      var sg = segs[k];
      if (sg[1] < t0) { continue; }
      if (sg[0] > t1) { break; }
      var x0 = xOf(sg[0], w), x1 = xOf(sg[1], w);
      if (x1 - x0 < 1) {
        var px = Math.floor(x0);
        if (px <= lastPx) { continue; }
        lastPx = px;
        ctx.fillStyle = phaseColor(sg[2]);
        ctx.fillRect(px, y, 1, h);
        continue;
      }
      lastPx = Math.floor(x1);
      var cx0 = Math.max(x0, -2), cx1 = Math.min(x1, w + 2);
      ctx.fillStyle = phaseColor(sg[2]);
      ctx.fillRect(cx0, y, cx1 - cx0, h);
      if (cx1 - cx0 > 54 && h >= 12) { named.push([cx0, cx1, sg]); }
    }
    // where each of its top spans begins (one import after another reads as such; spans fetched
    // as the zoom deepens show here too)
    ctx.fillStyle = "rgba(255,255,255,0.75)";
    var lastX = -10;
    for (var j = 0; j < ln.top.length; j++) {
      var s0 = ln.top[j];
      if (s0[4] > t1) { break; }
      if (spanEnd(s0) < t0 || (s0[7] & F_INSTANT)) { continue; }
      var sx = xOf(s0[4], w), ex = xOf(spanEnd(s0), w);
      if (ex - sx >= 4 && sx - lastX >= 3) { ctx.fillRect(Math.round(sx), y, 1, h); lastX = sx; }
    }
    named.forEach(function (n) {  // the names last: no mark drawn across them
      ctx.save();
      ctx.beginPath(); ctx.rect(n[0], y, n[1] - n[0], h); ctx.clip();
      ctx.fillStyle = "#111";
      ctx.font = "11px system-ui, sans-serif";
      ctx.fillText(n[2][2] + " " + fmtDur(n[2][1] - n[2][0]), Math.max(n[0], 0) + 3, y + h - 4);
      ctx.restore();
    });
  }

  // a folded group's row: each of its processes as a tick from its start to its end
  function drawGroup(row, k, w, t0, t1) {
    var g = groups[row.group];
    ctx.fillStyle = k % 2 ? "#fbfbfc" : "#ffffff";
    ctx.fillRect(0, row.y, w, row.h);
    ctx.fillStyle = "#e6e8eb";
    ctx.fillRect(0, row.y + row.h - 1, w, 1);
    g.lanes.forEach(function (i) {
      var info = lanes[i] && lanes[i].info;
      if (!info || info.start_s === null) { return; }
      var a = info.start_s * 1e6, b = (info.end_s === null ? info.start_s : info.end_s) * 1e6;
      if (b < t0 || a > t1) { return; }
      var x0 = xOf(a, w), x1 = xOf(b, w);
      ctx.fillStyle = "#7f8a99";
      ctx.fillRect(x0, row.y + 8, Math.max(2, x1 - x0), row.h - 16);
    });
  }

  // the critical path across lanes: the rest dimmed, each step in its phase's colour, outlined,
  // consecutive steps joined where the path moves to another lane
  function drawPath(w, h) {
    var steps = data.critical_path || [];
    ctx.fillStyle = "rgba(255,255,255,0.6)";
    ctx.fillRect(0, AXIS_H, w, h - AXIS_H);
    var prev = null;
    steps.forEach(function (st) {
      var y = rowY(st.lane);
      if (y === null || st.start_s === null || st.end_s === null) { return; }
      var x0 = xOf(st.start_s * 1e6, w), x1 = xOf(st.end_s * 1e6, w);
      if (prev && prev.y !== y) {
        ctx.fillStyle = "#1f2430";
        ctx.fillRect(Math.round(x0) - 1, Math.min(prev.y, y) + LANE_H / 2, 2, Math.abs(prev.y - y));
      }
      prev = { y: y };
      if (x1 < 0 || x0 > w) { return; }
      ctx.fillStyle = phaseColor(st.phase);
      ctx.fillRect(x0, y + 4, Math.max(1, x1 - x0), LANE_H - 8);
      ctx.strokeStyle = "#1f2430"; ctx.lineWidth = 1.5;
      ctx.strokeRect(x0, y + 4, Math.max(1, x1 - x0), LANE_H - 8);
    });
  }

  function draw() {
    if (!data) { return; }
    var w = canvas.width / (window.devicePixelRatio || 1);
    var h = canvas.height / (window.devicePixelRatio || 1);
    ctx.clearRect(0, 0, w, h);
    var t0 = view.t0, t1 = view.t1;
    // axis
    ctx.fillStyle = "#f6f7f9";
    ctx.fillRect(0, 0, w, AXIS_H);
    var step = niceStep(t1 - t0, w);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "alphabetic";
    var ticks = [];
    for (var t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      var x = xOf(t, w);
      ctx.fillStyle = "#e3e6ea";
      ctx.fillRect(Math.round(x), AXIS_H, 1, h - AXIS_H);
      ctx.fillStyle = "#444";
      ticks.push(fmtAxis(t, step));
      ctx.fillText(ticks[ticks.length - 1], x + 3, AXIS_H - 8);
    }
    canvas.setAttribute("data-axis", ticks.join("|"));  // what the axis says (the browser tests read it)
    // lanes
    display.forEach(function (row, k) {
      if (row.group !== undefined) { drawGroup(row, k, w, t0, t1); }
    });
    lanes.forEach(function (ln, i) {
      if (!ln.visible) { return; }
      ctx.fillStyle = i % 2 ? "#fbfbfc" : "#ffffff";
      ctx.fillRect(0, ln.y, w, ln.h);
      ctx.fillStyle = "#e6e8eb";
      ctx.fillRect(0, ln.y + ln.h - 1, w, 1);
      if (ln.proc) {
        var px0 = xOf(ln.proc[4], w), px1 = xOf(spanEnd(ln.proc), w);
        ctx.fillStyle = "rgba(120,130,145,0.18)";
        ctx.fillRect(px0, ln.y + 3, Math.max(1, px1 - px0), LANE_H - 6);
      }
      drawRow(ln.top, ln.y + 5, LANE_H - 10, w, t0, t1);
      paintTimeline(ln, ln.y + 5, LANE_H - 10, w, t0, t1);
      if (ln.overlay.length) { drawRow(ln.overlay, ln.y + LANE_H - 9, 5, w, t0, t1); }
      if (expanded[i]) {
        for (var r = 0; r < ln.rows.length; r++) {
          drawRow(ln.rows[r], ln.y + LANE_H + r * ROW_H, ROW_H - 2, w, t0, t1);
        }
      }
    });
    // ready marker; time after ready (busy loops, helpers of the running server) dimmed
    if (data.ready_s !== null) {
      var rx = xOf(data.ready_s * 1e6, w);
      if (rx < w) {
        ctx.fillStyle = "rgba(255,255,255,0.6)";
        ctx.fillRect(Math.max(0, rx), AXIS_H, w - Math.max(0, rx), h - AXIS_H);
      }
      ctx.fillStyle = "#2ca02c";
      ctx.fillRect(rx, AXIS_H, 2, h - AXIS_H);
    }
    if (pathOn) { drawPath(w, h); }
    if (data.live) {
      var nx = xOf(nowUs(), w);
      ctx.fillStyle = "rgba(214,39,40,0.6)";
      ctx.fillRect(nx, AXIS_H, 1, h - AXIS_H);
    }
    var range = document.getElementById("view-range");
    if (range) { range.textContent = fmtDur(t0) + " – " + fmtDur(t1); }
    if (data.live && !animTimer) {
      // in-progress spans keep growing
      animTimer = window.setTimeout(function () { animTimer = null; requestDraw(); }, 250);
    }
  }

  // ------------------------------------------------------------------ view
  function resetView() {
    // the window the page opens on: the run's start to its ready (time after ready is dimmed and
    // one zoom-out away), else to the run's last moment
    var end = data && data.live ? Math.max(totalUs, nowUs()) : totalUs;
    if (data && data.ready_s !== null && data.ready_s > 0) { end = Math.min(end, data.ready_s * 1e6); }
    view.t0 = 0;
    view.t1 = Math.max(10, end * 1.02);
    userZoomed = false;
  }

  function zoom(factor, centerFrac) {
    var span = view.t1 - view.t0;
    var c = view.t0 + span * centerFrac;
    var ns = Math.min(Math.max(span * factor, 10), Math.max(totalUs, nowUs()) * 50);
    view.t0 = c - ns * centerFrac;
    view.t1 = view.t0 + ns;
    userZoomed = true;
    requestDraw();
    scheduleDetail();
  }

  function locate(ev) {
    var rect = canvas.getBoundingClientRect();
    var x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    var w = rect.width;
    var t = view.t0 + (x / w) * (view.t1 - view.t0);
    var tol = 3 / w * (view.t1 - view.t0);
    for (var i = 0; i < lanes.length; i++) {
      var ln = lanes[i];
      if (!ln.visible || y < ln.y || y >= ln.y + ln.h) { continue; }
      var list;
      if (y < ln.y + LANE_H) {
        list = ln.top;
        var hit = findSpan(list, t, tol);
        if (!hit && ln.overlay.length && y > ln.y + LANE_H - 10) { hit = findSpan(ln.overlay, t, tol); }
        if (!hit && ln.proc) { hit = findSpan([ln.proc], t, 0); }
        return { lane: i, span: hit, x: ev.clientX, y: ev.clientY };
      }
      var r = Math.floor((y - ln.y - LANE_H) / ROW_H);
      list = ln.rows[r] || [];
      return { lane: i, span: findSpan(list, t, tol), x: ev.clientX, y: ev.clientY };
    }
    return null;
  }

  function findSpan(list, t, tol) {
    var lo = 0, hi = list.length - 1, idx = -1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (list[mid][4] <= t + tol) { idx = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    var best = null;
    for (var k = idx, n = 0; k >= 0 && n < 64; k--, n++) {
      var s = list[k];
      if (spanEnd(s) + tol >= t) {
        if (!best || (spanEnd(s) - s[4]) < (spanEnd(best) - best[4])) { best = s; }
      }
    }
    return best;
  }

  function showTooltip(hit) {
    if (!hit || !hit.span) { tooltip.hidden = true; return; }
    var s = hit.span, info = lanes[hit.lane].info;
    while (tooltip.firstChild) { tooltip.removeChild(tooltip.firstChild); }
    function line(text, cls) {
      var d = document.createElement("div");
      if (cls) { d.className = cls; }
      d.textContent = text;
      tooltip.appendChild(d);
    }
    line(s[2], "tt-name");
    line(info.label + " · phase " + s[3]);
    var dur = spanEnd(s) - s[4];
    if (s[7] & F_PROGRESS) {
      line("in progress, open for " + fmtDur(dur), "tt-progress");
    } else if (s[7] & F_INSTANT) {
      line("at " + fmtDur(s[4]));
    } else {
      line(fmtDur(s[4]) + " → " + fmtDur(spanEnd(s)) + " (" + fmtDur(dur) + ")");
    }
    var attrs = s[8];
    if (attrs) {
      Object.keys(attrs).slice(0, 14).forEach(function (k) {
        var v = attrs[k];
        if (typeof v === "object") { v = JSON.stringify(v); }
        var txt = String(v);
        if (txt.length > 160) { txt = txt.slice(0, 157) + "…"; }
        line(k + ": " + txt, k === "error" ? "tt-error" : "tt-attr");
      });
    }
    tooltip.hidden = false;
    var tx = hit.x + 14, ty = hit.y + 14;
    var tw = tooltip.offsetWidth, th = tooltip.offsetHeight;
    if (tx + tw > window.innerWidth - 8) { tx = hit.x - tw - 10; }
    if (ty + th > window.innerHeight - 8) { ty = hit.y - th - 10; }
    tooltip.style.left = (tx + window.scrollX) + "px";
    tooltip.style.top = (ty + window.scrollY) + "px";
  }

  canvas.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var rect = canvas.getBoundingClientRect();
    var frac = (ev.clientX - rect.left) / rect.width;
    zoom(Math.exp(ev.deltaY * 0.0015), frac);
  }, { passive: false });

  canvas.addEventListener("mousedown", function (ev) {
    drag = { x: ev.clientX, t0: view.t0, t1: view.t1, moved: false };
  });
  window.addEventListener("mousemove", function (ev) {
    if (drag) {
      var dx = ev.clientX - drag.x;
      if (Math.abs(dx) > 3) { drag.moved = true; }
      if (drag.moved) {
        var w = canvas.getBoundingClientRect().width;
        var dt = dx / w * (drag.t1 - drag.t0);
        view.t0 = drag.t0 - dt; view.t1 = drag.t1 - dt;
        userZoomed = true;
        tooltip.hidden = true;
        requestDraw();
      }
    }
  });
  window.addEventListener("mouseup", function (ev) {
    if (drag && !drag.moved && ev.target === canvas) {
      var hit = locate(ev);
      if (hit) { toggleLane(hit.lane); }
    }
    if (drag && drag.moved) { scheduleDetail(); }
    drag = null;
  });
  window.addEventListener("scroll", function () { if (userZoomed) { scheduleDetail(); } });
  canvas.addEventListener("mousemove", function (ev) {
    if (drag && drag.moved) { return; }
    showTooltip(locate(ev));
  });
  canvas.addEventListener("mouseleave", function () { tooltip.hidden = true; });

  document.getElementById("zoom-in").addEventListener("click", function () { zoom(0.5, 0.5); });
  document.getElementById("zoom-out").addEventListener("click", function () { zoom(2, 0.5); });
  document.getElementById("zoom-reset").addEventListener("click", function () { resetView(); requestDraw(); });
  document.getElementById("expand-all").addEventListener("click", function () {
    var any = lanes.some(function (ln, i) { return ln.visible && !expanded[i]; });
    lanes.forEach(function (ln, i) { expanded[i] = any && ln.visible; });
    if (!any) { hideTree(); }
    resize();
  });
  window.addEventListener("resize", function () { resize(); });
  document.getElementById("toggle-path").addEventListener("click", function (ev) {
    pathOn = !pathOn;
    ev.currentTarget.setAttribute("aria-pressed", pathOn ? "true" : "false");
    document.body.setAttribute("data-path", pathOn ? "on" : "off");
    requestDraw();
  });

  // ------------------------------------------------------------------ import tree
  function hideTree() {
    document.getElementById("import-tree").hidden = true;
    selectedLane = -1;
  }

  function showTree(i) {
    var ln = lanes[i];
    var panel = document.getElementById("import-tree");
    var root = document.getElementById("tree-root");
    document.getElementById("tree-title").textContent = ln.info.label;
    while (root.firstChild) { root.removeChild(root.firstChild); }
    if (!ln.complete) {
      var wait = document.createElement("p");
      wait.className = "muted tree-loading";
      wait.textContent = "loading the " + (ln.info.span_count || "") + " spans of this process…";
      root.appendChild(wait);
      panel.hidden = false;
      ensureComplete(i).then(function () { if (selectedLane === i && lanes[i] === ln) { showTree(i); } },
        function (err) { wait.textContent = "could not load this process's spans: " + err.message; });
      return;
    }
    var spans = ln.spans;  // complete: the index in `spans` is the position
    var children = {};
    var roots = [];
    for (var k = 0; k < spans.length; k++) {
      var s = spans[k];
      if (s[3] !== "import") { continue; }
      var p = s[1];
      if (p >= 0 && spans[p] && spans[p][3] === "import") {
        (children[p] = children[p] || []).push(k);
      } else {
        roots.push(k);
      }
    }
    function dur(k) { return spanEnd(spans[k]) - spans[k][4]; }
    function selfUs(k) {
      var a = spans[k][8];
      if (a && typeof a["starttrace.import.self_us"] === "number") { return a["starttrace.import.self_us"]; }
      var c = children[k] || [], sum = 0;
      for (var j = 0; j < c.length; j++) { sum += dur(c[j]); }
      return Math.max(0, dur(k) - sum);
    }
    function byDur(a, b) { return dur(b) - dur(a); }
    function render(list, container) {
      list.sort(byDur);
      var limit = 200;
      list.slice(0, limit).forEach(function (k) {
        var kids = children[k] || [];
        var name = spans[k][2].indexOf("import ") === 0 ? spans[k][2].slice(7) : spans[k][2];
        var text = name + " — " + fmtDur(dur(k)) + " (self " + fmtDur(selfUs(k)) + ")";
        if (spans[k][7] & F_PROGRESS) { text += " · in progress"; }
        if (kids.length) {
          var det = document.createElement("details");
          det.className = "tree-node";
          det.setAttribute("data-span", String(spans[k][0]));
          var sum = document.createElement("summary");
          sum.textContent = text + " · " + kids.length + " imports";
          det.appendChild(sum);
          var filled = false;
          det.addEventListener("toggle", function () {
            if (det.open && !filled) {
              filled = true;
              var box = document.createElement("div");
              box.className = "tree-children";
              render(kids.slice(), box);
              det.appendChild(box);
            }
          });
          container.appendChild(det);
        } else {
          var leaf = document.createElement("div");
          leaf.className = "tree-leaf";
          leaf.setAttribute("data-span", String(spans[k][0]));
          leaf.textContent = text;
          container.appendChild(leaf);
        }
      });
      if (list.length > limit) {
        var more = document.createElement("div");
        more.className = "muted";
        more.textContent = "… " + (list.length - limit) + " more";
        container.appendChild(more);
      }
    }
    if (!roots.length) {
      var none = document.createElement("p");
      none.className = "muted";
      none.textContent = "No import spans in this process.";
      root.appendChild(none);
    } else {
      render(roots, root);
    }
    panel.hidden = false;
  }

  // ------------------------------------------------------------------ loading and live refresh
  function load(first) {
    return fetch(jsonUrl, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (json) {
        prepare(json);
        if (first || !userZoomed) { resetView(); }
        resize();
        lanes.forEach(function (ln, i) { if (expanded[i] && !ln.complete) { ensureComplete(i).catch(function () {}); } });
        if (selectedLane >= 0 && selectedLane < lanes.length && !first) { showTree(selectedLane); }
        if (userZoomed) { scheduleDetail(); }
        var ind = document.getElementById("live-indicator");
        ind.hidden = !json.live;
        var st = document.getElementById("run-status");
        if (st) { st.textContent = json.status; st.className = "badge status-" + json.status; }
        var ss = document.getElementById("startup-s");
        if (ss) { ss.textContent = json.startup_s.toFixed(3) + " s"; }
        document.body.setAttribute("data-loaded", "true");
        if (json.live) { schedule(); } else if (!first) { refreshPanels(); }
      })
      .catch(function (err) {
        var range = document.getElementById("view-range");
        if (range) { range.textContent = "could not load the run: " + err.message; }
        if (data && data.live) { schedule(); }
      });
  }

  function refreshPanels() {
    return fetch(window.location.pathname + "?format=html", { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        ["panels", "summary"].forEach(function (id) {  // the summary and plan follow a live run too
          var fresh = doc.getElementById(id);
          var old = document.getElementById(id);
          if (fresh && old) { old.replaceWith(document.importNode(fresh, true)); }
        });
      })
      .catch(function () { /* keep the old panels */ });
  }

  function schedule() {
    if (refreshTimer) { window.clearTimeout(refreshTimer); }
    refreshTimer = window.setTimeout(function () {
      refreshTimer = null;
      load(false).then(function () { if (data && data.live) { refreshPanels(); } });
    }, 2000);
  }

  // ------------------------------------------------------------------ findings list
  // A click on a finding opens the import tree of its first process (the list lives in #panels,
  // which live refresh replaces: listen on the document).
  function wireFindings() {
    document.addEventListener("click", function (ev) {
      var item = ev.target && ev.target.closest ? ev.target.closest("#findings-list [data-lanes]") : null;
      if (!item || (ev.target.closest && ev.target.closest("summary, details"))) { return; }
      var first = parseInt((item.getAttribute("data-lanes") || "").split(",")[0], 10);
      if (!isNaN(first) && first >= 0 && first < lanes.length) { selectedLane = first; showTree(first); }
    });
  }

  wireFindings();
  load(true);
})();
