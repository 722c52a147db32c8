"use strict";
// kiln's compile report: draws the model (the JSON in #data) into #main. Lists are drawn a page
// at a time and a frame's body when it is opened, so a large trace opens as fast as a small one.
(function () {
  var errors = document.getElementById("errors");
  function report(msg) { errors.hidden = false; errors.textContent += msg + "\n"; }
  window.addEventListener("error", function (e) { report("script error: " + e.message + " (line " + e.lineno + ")"); });
  window.addEventListener("unhandledrejection", function (e) { report("script error: " + e.reason); });

  var D = JSON.parse(document.getElementById("data").textContent);
  var PAGE = 200, FRAME_PAGE = 30, OPEN_FRAMES = 3;

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) for (var k in attrs) {
      if (k === "text") el.textContent = attrs[k];
      else if (k === "html") el.innerHTML = attrs[k];   // (only SVG drawn by the report itself)
      else if (k === "cls") el.className = attrs[k];
      else el.setAttribute(k, attrs[k]);
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return el;
  }
  function secs(s) { return (s || 0).toFixed(3) + " s"; }
  function bytes(n) {
    n = n || 0; var u = ["B", "KiB", "MiB", "GiB"], i = 0;
    while (Math.abs(n) >= 1024 && i < 3) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n.toFixed(0)) + " " + u[i];
  }
  function pct(x) { return x === null || x === undefined ? "–" : Math.round(x * 100) + "%"; }
  function resumeLabel(fn) {
    var m = /^__kiln_resume_.*_line(\d+)$/.exec(fn || "");
    return m ? "continuation after line " + m[1] : (fn || "?");
  }
  function where(file, line) { return file ? file + (line ? ":" + line : "") : ""; }
  function lane(i) { var l = D.lanes[i]; return l ? l.label : ""; }

  // A list drawn PAGE rows at a time, with a "show more" button.
  function paged(container, items, drawOne, size) {
    size = size || PAGE;
    var shown = 0;
    var more = h("button", {cls: "more"});
    function next() {
      var frag = document.createDocumentFragment();
      var end = Math.min(items.length, shown + size);
      for (; shown < end; shown++) frag.appendChild(drawOne(items[shown], shown));
      container.appendChild(frag);
      if (shown < items.length) {
        more.textContent = "show " + Math.min(size, items.length - shown) + " more (" + (items.length - shown) + " left)";
        container.parentNode.appendChild(more);
      } else if (more.parentNode) more.parentNode.removeChild(more);
    }
    more.addEventListener("click", next);
    return next;
  }

  var main = document.getElementById("main"), nav = document.getElementById("nav");
  function section(id, title, count) {
    var s = h("section", {id: id}, h("h2", {text: title + (count !== undefined ? " (" + count + ")" : "")}));
    main.appendChild(s);
    nav.appendChild(h("a", {href: "#" + id, text: title + (count !== undefined ? " " + count : "")}));
    return s;
  }

  // -- overview -------------------------------------------------------------------------------
  var O = D.overview;
  document.getElementById("subtitle").textContent = D.title + " · built " + D.built + " · " + O.events + " events";
  var ov = section("overview", "Overview");
  var cards = h("div", {cls: "cards"});
  [["frames", O.frames], ["graphs", O.graphs], ["graph breaks", O.breaks], ["eager frames", O.eager],
   ["recompiles", O.recompiles], ["compile time", secs(O.compile_seconds)],
   ["cache hit rate", pct(O.cache_hit_rate) + " of " + ((O.cache.hit || 0) + (O.cache.miss || 0))],
   ["frame-record hits", pct(O.frame_hit_rate)], ["processes", O.processes]].forEach(function (c) {
    cards.appendChild(h("div", {cls: "card" + (c[0] === "graph breaks" && c[1] ? " warn" : "")},
      h("div", {cls: "num", text: String(c[1])}), h("div", {cls: "label", text: c[0]})));
  });
  ov.appendChild(cards);
  if (D.svg.stages) ov.appendChild(h("div", {cls: "pic", html: D.svg.stages}));
  if (O.bad_lines) ov.appendChild(h("p", {cls: "warn", text: O.bad_lines + " unreadable line(s) skipped"}));
  var procs = h("table", {cls: "tbl"}, h("tr", {}, h("th", {text: "process"}), h("th", {text: "events"}),
    h("th", {text: "command"}), h("th", {text: "trace file"})));
  D.lanes.forEach(function (l) {
    procs.appendChild(h("tr", {}, h("td", {text: l.label}), h("td", {text: String(l.events)}),
      h("td", {cls: "mono", text: (l.argv || []).join(" ")}), h("td", {cls: "mono", text: l.file})));
  });
  ov.appendChild(procs);

  // -- frames ---------------------------------------------------------------------------------
  var frames = section("frames", "Frames", D.frames.length);
  var flist = h("div", {cls: "frames"});
  frames.appendChild(flist);

  function sourceView(f) {
    var src = f.source;
    if (!src || !src.lines || !src.lines.length) return h("p", {cls: "dim", text: "(source not recorded)"});
    var marks = {};
    function mark(line, text) { if (line) (marks[line] = marks[line] || []).push(text); }
    f.breaks.forEach(function (b) {
      var here = !b.continues_at.length || b.continues_at.indexOf(b.line) >= 0;
      if (here) mark(b.line, "graph break: " + b.reason);
      else b.continues_at.forEach(function (n) {    // (the break is deeper, in a call made here)
        mark(n, "graph break inside this call, at " + where(b.file, b.line) + ": " + b.reason);
      });
    });
    f.eager.forEach(function (b) { if (b.line) (marks[b.line] = marks[b.line] || []).push("runs eagerly: " + b.reason); });
    var pre = h("pre", {cls: "source"});
    src.lines.forEach(function (text, i) {
      var n = src.first + i, m = marks[n];
      var row = h("span", {cls: "ln" + (m ? " brk" : "")}, h("span", {cls: "no", text: String(n)}), text + "\n");
      if (m) row.appendChild(h("span", {cls: "why", text: "  ⟵ " + m.join("; ") + "\n"}));
      pre.appendChild(row);
    });
    return pre;
  }

  // The user's lines around a break (it may be deep in a call, outside the frame's source).
  function breakContext(b) {
    var c = b.context;
    if (!c || !c.lines || !c.lines.length) return b.source_line ? h("pre", {cls: "code", text: b.source_line}) : null;
    var pre = h("pre", {cls: "source"});
    c.lines.forEach(function (text, i) {
      var n = c.first + i;
      pre.appendChild(h("span", {cls: "ln" + (n === b.line ? " brk" : "")}, h("span", {cls: "no", text: String(n)}), text + "\n"));
    });
    return pre;
  }

  function graphView(g) {
    var d = h("details", {cls: "graph"});
    var total = 0; for (var k in g.stages) total += g.stages[k];
    d.appendChild(h("summary", {}, h("b", {text: "graph " + g.graph_id}), " · " + resumeLabel(g.function) + " · " +
      g.ops + " ops" + (g.up_to_break ? " · up to a graph break" : "") + (total ? " · " + secs(total) : "") +
      (g.partition ? " · saves " + bytes(g.partition.activation_bytes) + " of activations" : "") +
      " · " + lane(g.lane)));
    var drawn = false;
    d.addEventListener("toggle", function () {
      if (!d.open || drawn) return;
      drawn = true;
      var stages = Object.keys(g.stages).map(function (s) { return s + " " + secs(g.stages[s]); }).join(", ");
      if (stages) d.appendChild(h("p", {text: "stages: " + stages}));
      d.appendChild(h("h4", {text: "captured graph"}));
      d.appendChild(h("pre", {cls: "code", text: g.code}));
      if (g.partition) {
        var p = g.partition;
        d.appendChild(h("h4", {text: "AOT forward (" + p.partitioner + " partitioner; saves " + p.saved + " values, " +
          bytes(p.activation_bytes) + " activations + " + bytes(p.saved_input_bytes) + " inputs)"}));
        d.appendChild(h("pre", {cls: "code", text: p.forward || ""}));
        d.appendChild(h("h4", {text: "AOT backward"}));
        d.appendChild(h("pre", {cls: "code", text: p.backward || ""}));
      }
      if (g.inductor.length) {
        var ul = h("ul", {});
        g.inductor.forEach(function (c) {
          ul.appendChild(h("li", {}, c.kind + ": ", h("a", {href: "file://" + c.path, text: c.path})));
        });
        d.appendChild(h("h4", {text: "Inductor's output code"}));
        d.appendChild(ul);
      }
      if (g.guards.length) {
        d.appendChild(h("h4", {text: "guards (" + g.guards.length + ")"}));
        d.appendChild(h("pre", {cls: "code guards", text: g.guards.join("\n")}));
      }
    });
    return d;
  }

  function frameBody(f, body) {
    if (f.flow_svg) body.appendChild(h("div", {cls: "pic", html: f.flow_svg}));
    if (f.breaks.length || f.eager.length) {
      var ul = h("ul", {cls: "breaks"});
      f.breaks.forEach(function (b) {
        ul.appendChild(h("li", {cls: "brk"}, h("b", {text: "graph break"}), " in " + resumeLabel(b.function) + " at " +
          where(b.file, b.line) + ": " + b.reason, breakContext(b)));
      });
      f.eager.forEach(function (b) {
        ul.appendChild(h("li", {cls: "eager"}, h("b", {text: "runs eagerly"}), " " + (b.function || "") + ": " + b.reason));
      });
      body.appendChild(ul);
    }
    if (f.recompiles.length) {
      var rl = h("ul", {cls: "recompiles"});
      f.recompiles.forEach(function (r) {
        rl.appendChild(h("li", {}, h("b", {text: "recompile"}), " of " + resumeLabel(r.function) + ": " + r.reason));
      });
      body.appendChild(rl);
    }
    if (f.stages_svg) body.appendChild(h("div", {cls: "pic", html: f.stages_svg}));
    body.appendChild(h("h4", {text: "source"}));
    body.appendChild(sourceView(f));
    if (f.graphs.length) {
      body.appendChild(h("h4", {text: "graphs (" + f.graphs.length + ")"}));
      f.graphs.forEach(function (g) { body.appendChild(graphView(g)); });
    }
  }

  function frameView(f, i) {
    var d = h("details", {cls: "frame", id: "frame-" + f.id});
    d.appendChild(h("summary", {}, h("b", {text: f.function || "?"}), " ",
      h("span", {cls: "dim", text: where(f.file, f.line)}), " · " + f.graphs.length + " graph(s)" +
      (f.breaks.length ? " · " + f.breaks.length + " graph break(s)" : "") +
      (f.eager.length ? " · runs eagerly" : "") +
      (f.recompiles.length ? " · " + f.recompiles.length + " recompile(s)" : "")));
    var body = h("div", {cls: "body"}), drawn = false;
    d.appendChild(body);
    function draw() { if (!drawn && d.open) { drawn = true; frameBody(f, body); } }
    d.addEventListener("toggle", draw);
    if (i < OPEN_FRAMES) { d.open = true; draw(); }
    return d;
  }
  paged(flist, D.frames, frameView, FRAME_PAGE)();

  // -- recompiles, cache misses ------------------------------------------------------------------
  function table(sec, heads, items, row) {
    if (!items.length) { sec.appendChild(h("p", {cls: "dim", text: "none"})); return; }
    var t = h("table", {cls: "tbl"}), head = h("tr", {});
    heads.forEach(function (x) { head.appendChild(h("th", {text: x})); });
    t.appendChild(head);
    sec.appendChild(t);
    paged(t, items, function (it) {
      var tr = h("tr", {});
      row(it).forEach(function (c) { tr.appendChild(typeof c === "string" ? h("td", {text: c}) : c); });
      return tr;
    })();
  }
  table(section("recompiles", "Recompiles", D.recompiles.length), ["function", "where", "failing guard", "process"],
    D.recompiles, function (r) { return [resumeLabel(r.function), where(r.file, r.line), r.reason, lane(r.lane)]; });
  var misses = D.cache.filter(function (c) { return c.action === "miss" || c.action === "frame_miss"; });
  var cacheSec = section("cache", "Cache misses", misses.length);
  var cc = O.cache, counts = Object.keys(cc).map(function (k) { return k + " " + cc[k]; }).join(" · ");
  cacheSec.appendChild(h("p", {text: counts || "no cache events"}));
  table(cacheSec, ["what", "function", "key", "why (the nearest stored entry's difference)"], misses, function (c) {
    var why = h("td", {});
    if (c.diff && c.diff.length) {
      var ul = h("ul", {cls: "diff"});
      c.diff.forEach(function (x) { ul.appendChild(h("li", {cls: "mono", text: x})); });
      why.appendChild(ul);
    } else why.textContent = c.reason || "";
    return [c.action === "miss" ? "graph" : "frame record", resumeLabel(c.function), c.key || "", why];
  });
  var other = D.cache.filter(function (c) { return c.action !== "miss" && c.action !== "frame_miss"; });
  if (other.length) {
    cacheSec.appendChild(h("h4", {text: "other cache events"}));
    table(cacheSec, ["what", "function", "detail"], other, function (c) {
      return [c.action, resumeLabel(c.function), c.reason || c.key || ""];
    });
  }

  // -- memory, CUDA graphs, packages ---------------------------------------------------------
  var mem = section("memory", "Saved activations", D.partitions.length);
  if (D.svg.partitions) mem.appendChild(h("div", {cls: "pic", html: D.svg.partitions}));
  else mem.appendChild(h("p", {cls: "dim", text: "no training graphs were partitioned"}));
  if (D.activations.length) {
    mem.appendChild(h("h4", {text: "saved-tensor hooks inlined"}));
    table(mem, ["pack hook", "packed", "kept", "before", "after", "offloaded"], D.activations, function (a) {
      return [a.pack || "", String(a.packed), String(a.kept), bytes(a.bytes_before), bytes(a.bytes_after),
              bytes(a.offloaded_bytes)];
    });
  }
  table(section("cudagraphs", "CUDA graphs", D.cudagraphs.length), ["decision", "graph", "why"], D.cudagraphs,
    function (c) { return [c.action, c.graph || "", c.reason || (c.parts ? c.parts + " parts" : "")]; });
  table(section("packages", "Packages", D.packages.length), ["what", "function", "path", "detail"], D.packages,
    function (p) { return [p.action, p.function || "", p.path || "", p.reason || (p.entries ? p.entries + " entries" : "")]; });

  // -- timeline, events -------------------------------------------------------------------------
  section("timeline", "Timeline").appendChild(h("div", {cls: "pic scroll", html: D.svg.timeline}));
  var evSec = section("events", "Events", D.events.length);
  var evTable = h("table", {cls: "tbl events"});
  evTable.appendChild(h("tr", {}, h("th", {text: "t"}), h("th", {text: "process"}), h("th", {text: "kind"}),
    h("th", {text: "function"}), h("th", {text: "message"})));
  evSec.appendChild(evTable);
  function eventRow(e) {
    return h("tr", {id: "ev-" + e[0], cls: "k-" + e[3]}, h("td", {text: e[1].toFixed(3)}), h("td", {text: lane(e[2])}),
      h("td", {text: e[3]}), h("td", {text: e[5] ? resumeLabel(e[5]) : ""}), h("td", {cls: "mono msg", text: e[6]}));
  }
  paged(evTable, D.events, eventRow)();

  // -- search ------------------------------------------------------------------------------------
  var index = null, results = h("section", {id: "results", hidden: ""});
  main.insertBefore(results, main.firstChild);
  function buildIndex() {
    index = [];
    D.frames.forEach(function (f) {
      var text = [f.function, f.file].concat(f.functions);
      f.breaks.concat(f.eager).forEach(function (b) { text.push(b.reason, b.source_line || ""); });
      f.recompiles.forEach(function (r) { text.push(r.reason); });
      f.graphs.forEach(function (g) { text.push(g.code, g.guards.join("\n")); });
      index.push({text: text.join("\n").toLowerCase(), label: "frame " + f.function + " " + where(f.file, f.line),
                  target: "frame-" + f.id});
    });
    D.events.forEach(function (e) {
      index.push({text: (e[3] + " " + e[5] + " " + e[6]).toLowerCase(), label: e[3] + " · " + resumeLabel(e[5]) +
        " · " + e[6].slice(0, 160), target: "ev-" + e[0], event: e[0]});
    });
  }
  function reveal(hit) {
    var el = document.getElementById(hit.target);
    if (!el && hit.event !== undefined) {           // an event row not drawn yet: draw it alone
      var e = D.events[hit.event];
      el = eventRow(e);
      evTable.appendChild(el);
    }
    if (el) {
      for (var p = el; p; p = p.parentElement) if (p.tagName === "DETAILS") p.open = true;
      el.scrollIntoView({block: "center"});
      el.classList.add("hit");
    }
  }
  function search(q) {
    q = q.trim().toLowerCase();
    results.innerHTML = "";
    if (!q) { results.hidden = true; return; }
    if (!index) buildIndex();
    var hits = index.filter(function (x) { return x.text.indexOf(q) >= 0; });
    results.hidden = false;
    results.appendChild(h("h2", {text: "Search: " + hits.length + " match(es)" + (hits.length > PAGE ? ", the first " + PAGE : "")}));
    var ul = h("ul", {cls: "hits"});
    hits.slice(0, PAGE).forEach(function (hit) {
      var a = h("a", {href: "#" + hit.target, text: hit.label});
      a.addEventListener("click", function (e) { e.preventDefault(); reveal(hit); });
      ul.appendChild(h("li", {}, a));
    });
    results.appendChild(ul);
  }
  var timer = null, box = document.getElementById("search");
  box.addEventListener("input", function () {
    clearTimeout(timer);
    timer = setTimeout(function () { search(box.value); }, 150);
  });
  // report.html#search=WORDS opens with that search (a link that shows one thing)
  var asked = /^#search=(.*)$/.exec(location.hash);
  if (asked) { box.value = decodeURIComponent(asked[1]); search(box.value); }
  document.body.setAttribute("data-ready", "1");
})();
