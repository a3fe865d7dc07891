"use strict";
// fragscope's HTML report: draws the figures in #data as inline SVG. Every string in the
// data comes from the traced program: it only ever reaches the page through textContent
// or attribute values, never as markup.
(function () {
  const SVGNS = "http://www.w3.org/2000/svg";
  const errors = [];
  function fail(msg) {
    errors.push(String(msg));
    const e = document.getElementById("errors");
    e.hidden = false;
    e.textContent = errors.join("\n");
    document.documentElement.dataset.errors = String(errors.length);
  }
  window.addEventListener("error", (ev) => fail("error: " + ev.message));
  document.addEventListener("securitypolicyviolation", (ev) =>
    fail("blocked by the page's policy: " + ev.violatedDirective + " " + ev.blockedURI));

  // ---- small helpers ----
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === "class") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of kids) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }
  function sv(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function bytes(n) {
    if (n === null || n === undefined) return "-";
    if (n < 0) return "-" + bytes(-n);
    let v = n, u = 0;
    while (v >= 1024 && u + 1 < UNITS.length) { v /= 1024; u++; }
    return u === 0 ? n + " B" : v.toFixed(1) + " " + UNITS[u];
  }
  function count(n) {
    if (n < 1e4) return String(n);
    if (n < 1e6) return (n / 1e3).toFixed(1) + " k";
    if (n < 1e9) return (n / 1e6).toFixed(1) + " M";
    return (n / 1e9).toFixed(2) + " G";
  }
  const secs = (ms) => (ms / 1000).toFixed(2) + " s";
  // Durations that may be short (GC pauses): milliseconds below a second.
  const duration = (ms) => (ms < 1000 ? ms.toFixed(ms < 10 ? 2 : 1) + " ms" : secs(ms));
  const pct = (part, whole) => (whole > 0 ? (100 * part / whole).toFixed(1) + "%" : "-");
  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = raw / p;
    return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
  }
  function ticks(max, n) {
    if (!(max > 0)) return [0];
    const step = niceStep(max / n);
    const t = [];
    for (let v = 0; v <= max * 1.0001; v += step) t.push(v);
    return t;
  }
  function byteTicks(max, n) {
    let unit = 1;
    while (max / unit >= 1024 && unit < Math.pow(1024, 5)) unit *= 1024;
    return ticks(max / unit, n).map((v) => v * unit);
  }
  function hue(name) {
    let h = 2166136261;
    for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619);
    return (h >>> 0);
  }
  const PALETTE = ["#3b82f6", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#06b6d4", "#84cc16", "#ec4899", "#64748b", "#f97316", "#14b8a6", "#a855f7"];
  const PART_COLORS = {
    live: "#3b82f6", rounding: "#a855f7", allocator_overhead: "#6366f1", free_in_used_pages: "#ef4444", free_resident_pages: "#f59e0b",
    lazy_free: "#fde68a", pymalloc_arenas: "#14b8a6", sbcl_dynamic_space: "#0d9488", go_heap: "#0891b2", jvm_heap: "#0e7490", jvm_runtime: "#155e75", v8_heap: "#65a30d", other_anon: "#94a3b8", file: "#cbd5e1", fragscope_own: "#4b5563",
  };

  const tip = el("div", { class: "tip" });
  document.body.append(tip);
  function showTip(ev, content) {
    tip.replaceChildren(content);
    tip.style.display = "block";
    const w = tip.offsetWidth, h = tip.offsetHeight;
    let x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth) x = Math.max(0, ev.clientX - w - 14);
    if (y + h > window.innerHeight) y = Math.max(0, ev.clientY - h - 14);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  const hideTip = () => { tip.style.display = "none"; };
  function tipTable(title, rows) {
    const t = el("table");
    for (const [k, v, color] of rows) {
      const sw = color ? el("span", { class: "sw" }) : "";
      if (color) { sw.style.cssText = "display:inline-block;width:9px;height:9px;margin-right:4px;background:" + color; }
      t.append(el("tr", {}, el("td", {}, sw, k), el("td", { class: "num" }, v)));
    }
    return el("div", {}, el("b", {}, title), t);
  }
  function legend(items) {
    const d = el("div", { class: "legend" });
    for (const [name, color, dashed] of items) {
      const sw = el("span", { class: "sw" });
      sw.style.background = dashed ? "repeating-linear-gradient(90deg," + color + " 0 3px,transparent 3px 5px)" : color;
      d.append(el("span", {}, sw, name));
    }
    return d;
  }
  function section(parent, title, id) {
    const s = el("section", id ? { id } : {}, el("h2", {}, title));
    parent.append(s);
    return s;
  }
  function table(head, rows, cls) {
    const t = el("table", { class: "data " + (cls || "") });
    t.append(el("tr", {}, ...head.map((h) => el("th", {}, h))));
    for (const r of rows) {
      t.append(el("tr", {}, ...r.map((c, i) => (i === 0 ? el("td", { class: "label" }, c) : el("td", {}, c)))));
    }
    return t;
  }
  function select(options, chosen, onChange) {
    const s = el("select");
    options.forEach(([value, label]) => {
      const o = el("option", { value: String(value) }, label);
      if (value === chosen) o.selected = true;
      s.append(o);
    });
    s.addEventListener("change", () => onChange(s.value));
    return s;
  }

  // A time chart: axes, grid, and the scales of its plot area.
  function timeChart(parent, o) {
    const W = o.width || 1100, H = o.height || 300;
    const m = { l: 72, r: 16, t: 18, b: 30 };
    const svg = sv("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "chart " + (o.cls || "") });
    svg.style.maxWidth = "100%";
    svg.style.height = "auto";
    const tmax = o.tmax > 0 ? o.tmax : 1, ymax = o.ymax > 0 ? o.ymax * 1.05 : 1;
    const x = (t) => m.l + (W - m.l - m.r) * t / tmax;
    const y = (v) => H - m.b - (H - m.t - m.b) * v / ymax;
    const axis = sv("g", { class: "axis" });
    for (const v of (o.yfmt === "count" ? ticks(ymax, 5) : byteTicks(ymax, 5))) {
      axis.append(sv("line", { class: "grid", x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }));
      axis.append(sv("text", { x: m.l - 6, y: y(v) + 4, "text-anchor": "end" }, o.yfmt === "count" ? count(v) : bytes(Math.round(v))));
    }
    for (const v of ticks(tmax / 1000, 8)) {
      axis.append(sv("line", { x1: x(v * 1000), x2: x(v * 1000), y1: H - m.b, y2: H - m.b + 4 }));
      axis.append(sv("text", { x: x(v * 1000), y: H - m.b + 16, "text-anchor": "middle" }, +v.toFixed(3) + " s"));
    }
    axis.append(sv("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
    svg.append(axis);
    parent.append(svg);
    return { svg, x, y, W, H, m, tmax };
  }
  function phaseMarks(c, phases) {
    const g = sv("g", { class: "phases" });
    phases.forEach((p, i) => {
      const x0 = c.x(p.start_ms), x1 = c.x(p.end_ms);
      g.append(sv("rect", { class: "phase", x: x0, y: c.m.t, width: Math.max(1, x1 - x0), height: c.H - c.m.t - c.m.b, fill: i % 2 ? "#f3f4f6" : "#fafafa" }));
      g.append(sv("line", { x1: x0, x2: x0, y1: c.m.t, y2: c.H - c.m.b, stroke: "#9ca3af", "stroke-dasharray": "3 3" }));
      if (x1 - x0 > 40) g.append(sv("text", { x: x0 + 4, y: c.m.t + 10, fill: "#6b7280" }, p.kind));
    });
    c.svg.insertBefore(g, c.svg.firstChild.nextSibling);
  }
  function linePath(xs, ys, c) {
    let d = "";
    for (let i = 0; i < xs.length; i++) {
      if (ys[i] === null || ys[i] === undefined) continue;
      d += (d ? "L" : "M") + c.x(xs[i]).toFixed(1) + "," + c.y(ys[i]).toFixed(1);
    }
    return d;
  }
  function nearest(ts, t) {
    let best = 0;
    for (let i = 1; i < ts.length; i++) if (Math.abs(ts[i] - t) < Math.abs(ts[best] - t)) best = i;
    return best;
  }
  // Hover: a guide line at the nearest of `ts`; `content(i)` is the tooltip.
  function hover(c, ts, content) {
    if (!ts.length) return;
    const guide = sv("line", { class: "guide", y1: c.m.t, y2: c.H - c.m.b, stroke: "#111", "stroke-width": 1, visibility: "hidden" });
    const zone = sv("rect", { x: c.m.l, y: c.m.t, width: c.W - c.m.l - c.m.r, height: c.H - c.m.t - c.m.b, fill: "transparent" });
    c.svg.append(guide, zone);
    zone.addEventListener("mousemove", (ev) => {
      const r = c.svg.getBoundingClientRect();
      const px = (ev.clientX - r.left) * c.W / r.width;
      const t = (px - c.m.l) / (c.W - c.m.l - c.m.r) * c.tmax;
      const i = nearest(ts, t);
      guide.setAttribute("x1", c.x(ts[i]));
      guide.setAttribute("x2", c.x(ts[i]));
      guide.setAttribute("visibility", "visible");
      showTip(ev, content(i));
    });
    zone.addEventListener("mouseleave", () => { guide.setAttribute("visibility", "hidden"); hideTip(); });
  }

  // ---- the malloc report ----
  function decompositionChart(parent, R, o) {
    o = o || {};
    const S = R.snapshots, n = S.t_ms.length, T = R.timeline;
    const layers = R.parts_names.filter(([k]) => S.parts[k].some((v) => v > 0));
    const tmax = Math.max(R.duration_ms, ...S.t_ms, ...T.t_ms, 1);
    let ts = S.t_ms.slice(), idx = ts.map((_, i) => i);
    if (n === 1) { const w = Math.max(tmax / 200, 1); ts = [Math.max(0, ts[0] - w), Math.min(tmax, ts[0] + w)]; idx = [0, 0]; }
    const tops = idx.map(() => 0);
    let ymax = Math.max(0, ...T.rss, o.ymax || 0);
    for (const [k] of layers) idx.forEach((s, j) => { tops[j] += S.parts[k][s]; });
    ymax = Math.max(ymax, ...tops);
    const c = timeChart(parent, { tmax, ymax, width: o.width, height: o.height || 320, cls: "decomposition" });
    phaseMarks(c, R.phases);
    const base = idx.map(() => 0);
    const g = sv("g", { class: "areas" });
    for (const [k] of layers) {
      const top = idx.map((s, j) => base[j] + (S.parts[k][s] || 0));
      // A part unknown at a snapshot (null: no census of its heap there) leaves a gap:
      // one area per run of snapshots where it is known.
      let d = "", run = [];
      const close = () => {
        if (!run.length) return;
        run.forEach((j, n) => { d += (n ? "L" : "M") + c.x(ts[j]).toFixed(1) + "," + c.y(top[j]).toFixed(1); });
        for (let n = run.length - 1; n >= 0; n--) d += "L" + c.x(ts[run[n]]).toFixed(1) + "," + c.y(base[run[n]]).toFixed(1);
        d += "Z";
        run = [];
      };
      idx.forEach((s, j) => { if (S.parts[k][s] === null) close(); else run.push(j); });
      close();
      g.append(sv("path", { class: "area", "data-part": k, d, fill: PART_COLORS[k], "fill-opacity": 0.9 }));
      top.forEach((v, j) => { base[j] = v; });
    }
    c.svg.append(g);
    if (T.t_ms.length) c.svg.append(sv("path", { class: "rss-line", d: linePath(T.t_ms, T.rss, c), fill: "none", stroke: "#111", "stroke-width": 1.5 }));
    if (!n && T.t_ms.length) c.svg.append(sv("path", { class: "live-line", d: linePath(T.t_ms, T.live, c), fill: "none", stroke: PART_COLORS.live, "stroke-width": 1.5 }));
    for (const t of S.t_ms) c.svg.append(sv("line", { class: "snap-mark", x1: c.x(t), x2: c.x(t), y1: c.H - c.m.b, y2: c.H - c.m.b + 5, stroke: "#111" }));
    if (n) {
      hover(c, S.t_ms, (i) => {
        // null: the runtime's heap was not censused at this snapshot (within other anonymous).
        const rows = R.parts_names.filter(([k]) => S.parts[k][i] !== 0).map(([k, name]) => [name, S.parts[k][i] === null ? "unknown (no census here)" : bytes(S.parts[k][i]), PART_COLORS[k]]);
        if (S.unexplained[i]) rows.push(["unexplained", bytes(S.unexplained[i])]);
        rows.push(["RSS at the snapshot", bytes(S.rss[i])]);
        if (T.t_ms.length) rows.push(["RSS (timeline)", bytes(T.rss[nearest(T.t_ms, S.t_ms[i])])]);
        return tipTable("snapshot at " + secs(S.t_ms[i]) + " (" + S.reason[i] + ")", rows);
      });
    } else {
      hover(c, T.t_ms, (i) => tipTable(secs(T.t_ms[i]), [["RSS", bytes(T.rss[i])], ["live", bytes(T.live[i])]]));
    }
    const items = layers.map(([k, name]) => [name, PART_COLORS[k]]);
    items.push(["RSS (every 10 ms)", "#111"]);
    parent.append(legend(items));
    return c;
  }

  // A bar chart of buckets, counts up the axis: `bars` are {label, n, color, title, tip}
  // (the tooltip's title and rows).
  function histogram(parent, bars, o) {
    const W = o.width || 700, H = o.height || 240, m = { l: 72, r: 10, t: 16, b: 34 };
    const svg = sv("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "chart " + o.cls });
    svg.style.maxWidth = "100%";
    svg.style.height = "auto";
    const ymax = Math.max(1, ...bars.map((b) => b.n)) * 1.08;
    const y = (v) => H - m.b - (H - m.t - m.b) * v / ymax;
    const bw = (W - m.l - m.r) / Math.max(1, bars.length);
    for (const v of ticks(ymax, 4)) {
      svg.append(sv("line", { class: "grid", x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }));
      svg.append(sv("text", { x: m.l - 6, y: y(v) + 4, "text-anchor": "end" }, count(Math.round(v))));
    }
    bars.forEach((b, j) => {
      const x = m.l + j * bw;
      const r = sv("rect", { class: "bar", x: x + 2, y: y(b.n), width: bw - 4, height: Math.max(0, y(0) - y(b.n)), fill: b.color });
      r.addEventListener("mousemove", (ev) => showTip(ev, tipTable(b.title, b.tip)));
      r.addEventListener("mouseleave", hideTip);
      svg.append(r);
      svg.append(sv("text", { x: x + bw / 2, y: H - m.b + 14, "text-anchor": "middle" }, b.label));
      if (b.n > 0) svg.append(sv("text", { x: x + bw / 2, y: y(b.n) - 3, "text-anchor": "middle" }, count(b.n)));
    });
    svg.append(sv("text", { x: m.l, y: H - 4 }, o.caption));
    parent.append(svg);
    return svg;
  }
  // Fill buckets' colours: nearly empty ones are the waste, as in the page occupancy.
  const fillColor = (j) => (j <= 3 ? PART_COLORS.free_in_used_pages : PART_COLORS.live);

  function occupancyChart(parent, R, i, o) {
    o = o || {};
    const ps = R.snapshots.page_size[i] || 4096;
    const bars = (R.snapshots.occupancy[i] || []).map((b, j) => {
      const label = b[1] === 0 ? "no live" : b[0] + "-" + b[1] + "%";
      return {
        label, n: b[2], color: b[1] === 0 ? PART_COLORS.free_resident_pages : fillColor(j), title: label + " live",
        tip: [["pages", count(b[2])], ["their bytes", bytes(b[2] * ps)], ["live bytes in them", bytes(b[3])]],
      };
    });
    return histogram(parent, bars, { width: o.width, height: o.height, cls: "occupancy", caption: "resident heap pages by the share of their bytes that is live" });
  }

  // A runtime heap's own fill buckets (pymalloc's pools, SBCL's pages) at one snapshot.
  function runtimeFillChart(parent, name, F) {
    const bars = F.buckets.map((b, j) => {
      const label = b.lo_pct + "-" + b.hi_pct + "%";
      return { label, n: b.count, color: fillColor(j), title: label + " in use", tip: [[F.unit, count(b.count)], ["their bytes", bytes(b.count * F.unit_bytes)], ["bytes in use", bytes(b.bytes_in_use)]] };
    });
    return histogram(parent, bars, { cls: "occupancy runtime-fill", caption: name + ": " + F.unit + " in use by the share of their bytes in use" });
  }

  function occupancySection(main, R) {
    const S = R.snapshots;
    const s = section(main, "Page occupancy", "occupancy");
    if (!S.t_ms.length) { s.append(el("p", { class: "note" }, "No page-residency snapshot was taken.")); return; }
    const heapName = (h) => R.heap_names[h] || h;
    let chosen = R.focus_snapshot ?? S.t_ms.length - 1;
    // The heap the headline is about first; the others the process has after it.
    const heaps = ["malloc"].concat(["pymalloc", "sbcl", "go"].filter((h) => S[h + "_fill"].some((f) => f)));
    let heap = heaps.includes(R.headline.heap) ? R.headline.heap : "malloc";
    const holder = el("div");
    const opts = S.t_ms.map((t, i) => {
      const tags = [];
      if (i === R.focus_snapshot) tags.push(R.focus_role);
      if (i === R.peak_snapshot) tags.push("peak RSS");
      if (i === R.end_snapshot) tags.push("end");
      return [i, secs(t) + " (" + S.reason[i] + ")" + (tags.length ? " - " + tags.join(", ") : "")];
    });
    const draw = () => {
      holder.replaceChildren();
      if (heap === "malloc") { occupancyChart(holder, R, chosen); return; }
      const F = S[heap + "_fill"][chosen];
      if (F) runtimeFillChart(holder, heapName(heap), F);
      else holder.append(el("p", { class: "note" }, "No census of the " + heapName(heap) + " at this snapshot: its figures are unknown here."));
    };
    const controls = el("div", { class: "controls" }, "snapshot ", select(opts, chosen, (v) => { chosen = +v; draw(); }));
    if (heaps.length > 1) controls.append(" heap ", select(heaps.map((h) => [h, heapName(h)]), heap, (v) => { heap = v; draw(); }));
    s.append(controls);
    s.append(holder);
    draw();
  }

  function linesChart(parent, o) {
    const all = o.series.flatMap((s) => s.values.filter((v) => v !== null));
    const c = timeChart(parent, { tmax: o.tmax, ymax: o.ymax || Math.max(0, ...all), width: o.width, height: o.height || 260, cls: o.cls });
    if (o.phases) phaseMarks(c, o.phases);
    for (const s of o.series) {
      const attrs = { class: "series " + (o.lineClass || ""), d: linePath(o.ts, s.values, c), fill: "none", stroke: s.color, "stroke-width": 1.6 };
      if (s.dashed) attrs["stroke-dasharray"] = "5 3";
      c.svg.append(sv("path", attrs));
    }
    hover(c, o.ts, (i) => tipTable(secs(o.ts[i]), o.series.map((s) => [s.name, bytes(s.values[i]), s.color])));
    parent.append(legend(o.series.map((s) => [s.name, s.color, s.dashed])));
    return c;
  }

  function sizeClassSection(main, R) {
    const s = section(main, "Size classes", "size-classes");
    const when = R.focus_snapshot !== null && R.focus_snapshot !== undefined ? " at " + secs(R.snapshots.t_ms[R.focus_snapshot]) + " (" + R.focus_phrase + ")" : "";
    s.append(el("p", { class: "note" }, "Classes are the allocator's usable sizes" + when + "; retained free bytes are free bytes in resident pages the class dominates or last dominated."));
    const rows = R.size_classes.map((c) => [
      c.usable === 0 ? "(freed before seen)" : bytes(c.usable), count(c.objects), bytes(c.live_bytes), count(c.pages),
      (100 * c.mean_occupancy).toFixed(1) + "%", bytes(c.retained_free), bytes(c.retained_free - c.retained_free_first),
    ]);
    s.append(table(["class", "objects", "live", "pages", "mean occupancy", "retained free", "growth"], rows, "classes"));
    const H = R.class_history;
    if (!H.t_ms.length || !H.usable.length) return;
    s.append(el("h2", {}, "Per class over time"));
    const holder = el("div");
    const tmax = Math.max(R.duration_ms, ...H.t_ms, 1);
    const draw = (field) => {
      holder.replaceChildren();
      linesChart(holder, {
        tmax, ts: H.t_ms, phases: R.phases, cls: "class-history", lineClass: "class-line",
        series: H.usable.map((u, j) => ({ name: (u === 0 ? "freed before seen" : bytes(u)) + " class", values: H[field][j], color: PALETTE[j % PALETTE.length] })),
      });
    };
    s.append(el("div", { class: "controls" }, "show ", select([["retained_free", "retained free bytes"], ["live_bytes", "live bytes"]], "retained_free", draw)));
    s.append(holder);
    draw("retained_free");
  }

  // CPython's pymalloc at the census with the most free space, and the Python lines whose
  // sampled objects keep its arenas (the text report's pymalloc part).
  function pymallocSection(main, R) {
    if (!R.pymalloc && !R.pymalloc_note && !R.python_sites_note) return;
    const s = section(main, "CPython small objects (pymalloc)", "pymalloc");
    if (R.pymalloc_note) s.append(el("p", { class: "note" }, R.pymalloc_note));
    if (!R.pymalloc) {
      if (R.python_sites_note) s.append(el("p", { class: "note" }, R.python_sites_note));
      return;
    }
    const P = R.pymalloc.census;
    s.append(el("p", { class: "note" }, "CPython " + P.python + " at " + secs(R.pymalloc.t_ms) + ": " + bytes(P.resident) + " in " + count(P.arenas) + " arenas of " + bytes(P.arena_size) + " (" +
      count(P.arenas_in_use) + " hold a pool in use), " + count(P.pools) + " pools of " + bytes(P.pool_size) + " (" + count(P.pools_in_use) + " in use); the census paused the program " + P.pause_ms.toFixed(1) + " ms."));
    s.append(table(["part", "bytes", "of the arenas"], [
      ["blocks in use", P.in_use], ["free in pools in use", P.free_in_used_pools], ["free pools in arenas in use", P.free_pools], ["arenas with no pool in use", P.empty_arenas],
    ].map(([name, v]) => [name, bytes(v), pct(v, P.resident)]), "pymalloc-parts"));
    s.append(el("h3", {}, "Pools in use by bytes in use"));
    histogram(s, P.pool_fill.map((b, j) => {
      const label = b.lo_pct + "-" + b.hi_pct + "%";
      return { label, n: b.count, color: fillColor(j), title: label + " in use", tip: [["pools", count(b.count)], ["their bytes", bytes(b.count * P.pool_size)], ["bytes in use", bytes(b.bytes_in_use)]] };
    }), { cls: "pool-fill", caption: "pools in use by the share of their bytes in use" });
    s.append(el("h3", {}, "Size classes with the most free bytes in pools in use"));
    s.append(table(["block size", "pools", "in use", "free"], P.classes.slice(0, 5).map((c) => [bytes(c.block_size), count(c.pools), bytes(c.blocks_in_use * c.block_size), bytes(c.blocks_free * c.block_size)]), "pymalloc-classes"));
    if (R.python_sites_note) s.append(el("p", { class: "note" }, R.python_sites_note));
    const Y = R.python_sites;
    if (!Y) return;
    s.append(el("h3", {}, "Python lines whose objects keep the arenas"));
    s.append(el("p", { class: "note" }, count(Y.samples) + " objects sampled, one per " + bytes(Y.mean_bytes) + " allocated on average; " + count(Y.live_samples) + " live at this census, in " +
      count(Y.arenas_sampled) + " of the " + count(Y.arenas_in_use) + " arenas in use. Figures are estimates from the samples; expand a line for its callers."));
    const line = (y) => (y.callers.length ? el("details", {}, el("summary", {}, y.location), ...y.callers.map((c) => el("div", { class: "caller" }, "\u2190 " + c))) : y.location);
    const est = (v) => bytes(Math.round(v));
    s.append(table(["line", "holds", "live", "arenas", "allocated"], Y.sites.filter((y) => y.allocated_bytes > 0).map((y) => [line(y), est(y.held_bytes), est(y.live_bytes), count(y.arenas), est(y.allocated_bytes)]), "python-sites"));
    if (Y.held_unattributed > 0) s.append(el("p", { class: "note" }, bytes(Y.held_unattributed) + " is held in arenas where no sampled object lives (a smaller --sample-bytes samples more)."));
    if (Y.problem) s.append(el("p", { class: "warn" }, Y.problem));
  }

  // A Go program's heap: its spans split by residency, the runtime's own figures, the
  // size classes keeping the most free bytes, and the heap profile's stacks.
  function goSection(main, R) {
    if (!R.go && !R.go_note) return;
    const s = section(main, "Go heap", "go");
    if (R.go_note) s.append(el("p", { class: "note" }, R.go_note));
    if (!R.go) return;
    const G = R.go.census;
    s.append(el("p", { class: "note" }, "Go heap (" + G.go + ") at " + secs(R.go.t_ms) + ": " + bytes(G.resident) + " resident, " + count(G.spans_in_use) + " spans in use; " +
      bytes(G.released) + " released to the kernel (not in RSS). As runtime.MemStats counts them: HeapAlloc " + bytes(G.heap_alloc) + ", HeapInuse " + bytes(G.heap_in_use) +
      ", HeapIdle " + bytes(G.heap_idle) + ", StackInuse " + bytes(G.stack_in_use) + ". The census paused the program " + G.pause_ms.toFixed(1) + " ms."));
    s.append(table(["part", "bytes", "of the heap"], [
      ["objects", G.objects], ["free slots in spans in use", G.free_slots], ["free pages kept", G.idle_kept], ["goroutine stacks", G.stacks],
    ].map(([name, v]) => [name, bytes(v), pct(v, G.resident)]), "go-parts"));
    s.append(el("h3", {}, "Size classes with the most free bytes in their spans"));
    s.append(table(["slots", "spans", "in use", "free"], G.classes.slice(0, 8).map((c) => [c.class === 0 ? "large objects" : bytes(c.slot_bytes), count(c.spans), bytes(c.in_use_bytes), bytes(c.span_bytes - c.in_use_bytes)]), "go-classes"));
    if (R.go_sites_note) s.append(el("p", { class: "note" }, "No Go allocation sites: " + R.go_sites_note + "."));
    const Y = R.go_sites;
    if (!Y) return;
    s.append(el("h3", {}, "Go allocation sites"));
    s.append(el("p", { class: "note" }, "The runtime's heap profile at " + secs(Y.t_ms) + ", one sample per " + bytes(Y.rate) + " allocated, scaled as go tool pprof does; " + count(Y.sampled_live) +
      " sampled objects live, " + count(Y.sampled_in_sparse_spans) + " of them in spans at most 25% full. Expand a site for its callers."));
    const site = (y) => (y.stack.length > 1 ? el("details", {}, el("summary", {}, y.stack[0]), ...y.stack.slice(1).map((c) => el("div", { class: "caller" }, "\u2190 " + c))) : y.stack[0] || "?");
    s.append(table(["site", "in use", "objects", "allocated", "sparse spans kept"], Y.sites.slice(0, 10).map((y) => [site(y), bytes(y.in_use_bytes), count(y.in_use_objects), bytes(y.allocated_bytes), y.sampled_in_sparse_spans ? bytes(y.pinned_free_bytes) : "-"]), "go-sites"));
  }

  // A JVM's Java heap: its regions or spaces split by residency, the collector's own
  // figures, the spaces by kind and the runtime areas the JVM's tables locate.
  function jvmSection(main, R) {
    if (!R.jvm && !R.jvm_note) return;
    const s = section(main, "Java heap", "jvm");
    if (R.jvm_note) s.append(el("p", { class: "note" }, R.jvm_note));
    if (!R.jvm) return;
    const J = R.jvm.census;
    s.append(el("p", { class: "note" }, "Java heap (JDK " + J.jvm + ", " + J.collector + " collector" + (J.region_bytes ? ", regions of " + bytes(J.region_bytes) : "") + ") at " + secs(R.jvm.t_ms) + ": " +
      bytes(J.resident) + " resident of " + bytes(J.committed) + " committed, " + bytes(J.reserved) + " reserved (-Xmx " + bytes(J.max_heap) + ", -Xms " + bytes(J.initial_heap) +
      "). As the collector counts them: " + bytes(J.committed_reported) + " committed, " + bytes(J.used_reported) + " used. The census paused the JVM " + J.pause_ms.toFixed(1) + " ms."));
    s.append(table(["part", "bytes", "of the heap"], [
      ["objects (live or not yet collected)", J.objects], ["young generation's free room", J.young_free], ["free space among old objects", J.old_free], ["free regions kept", J.free_regions],
    ].map(([name, v]) => [name, bytes(v), pct(v, J.resident)]), "jvm-parts"));
    s.append(table(["spaces", "count", "bytes", "used", "resident"], J.spaces.map((k) => [k.kind, count(k.spaces), bytes(k.bytes), bytes(k.used), bytes(k.resident)]), "jvm-spaces"));
    if (J.humongous_objects > 0) s.append(el("p", { class: "note" }, count(J.humongous_objects) + " humongous objects take " + count(J.humongous_regions) + " regions (" + bytes(J.humongous_resident) + " resident): committed heap that counts against -Xmx."));
    if (J.areas.length) {
      s.append(el("h3", {}, "Runtime areas outside the heap"));
      s.append(table(["area", "count", "mapped", "resident"], J.areas.map((a) => [a.area, count(a.count), bytes(a.bytes), bytes(a.resident)]), "jvm-areas"));
    }
  }

  // A Node.js process's V8 heap as V8 counts it: its spaces' physical bytes split into
  // objects and free space.
  function v8Section(main, R) {
    if (!R.v8) return;
    const s = section(main, "V8 heap", "v8");
    const V = R.v8.census;
    s.append(el("p", { class: "note" }, "V8 heap (Node " + V.node + ", " + count(V.isolates) + " isolates) at " + secs(R.v8.t_ms) + ": " + bytes(V.physical) + " physical of " +
      bytes(V.committed) + " committed, " + bytes(V.objects) + " of objects, " + bytes(V.free) + " free; old generation limit " + bytes(V.heap_size_limit) + ", external memory " +
      bytes(V.external_memory) + " (ArrayBuffers' backing stores, in malloc's heap). Figures as V8 counted them " + V.age_ms + " ms before the snapshot."));
    s.append(table(["space", "committed", "used", "available", "physical"], V.spaces.map((x) => [x.space, bytes(x.size), bytes(x.used), bytes(x.available), bytes(x.physical)]), "v8-spaces"));
  }

  // Pages shared with other processes and the process's own (after fork: copied since or
  // made), by part; then every process of the trace, workers under their parent.
  function sharingSection(main, R) {
    const S = R.sharing && R.sharing.sharing;
    const listed = (R.processes || []).length > 1;
    if (!(S && (S.forked || S.anonymous.shared > 0)) && !listed) return;
    const s = section(main, "Shared and private pages", "sharing");
    if (S && (S.forked || S.anonymous.shared > 0)) {
      const ru = S.rollup;
      s.append(el("p", { class: "note" }, "At " + secs(R.sharing.t_ms) + ": pages another process maps too (after fork: the parent, a sibling) and this process's own, from pagemap." +
        (ru ? " smaps_rollup: RSS " + bytes(ru.rss) + " = shared " + bytes(ru.shared) + " + private " + bytes(ru.private) + "; PSS " + bytes(ru.pss) + "." : "") +
        (S.inherited !== null ? " It started with " + bytes(S.inherited) + " of heap memory shared with its parent: " + bytes(S.anonymous.copied) + " (" + pct(S.anonymous.copied, S.inherited) + ") copied since." : "")));
      const name = Object.fromEntries(R.parts_names);
      const label = (p) => name[p] || { malloc_heap: "malloc heap", pymalloc_arenas: "pymalloc arenas", sbcl_dynamic_space: "SBCL dynamic space", go_heap: "Go heap", jvm_heap: "Java heap", jvm_runtime: "JVM runtime areas", other_anon: "other anonymous" }[p] || p;
      const row = (n, o) => [n, bytes(o.resident), bytes(o.shared), bytes(o.resident - o.shared)].concat(S.forked ? [bytes(o.copied)] : []);
      s.append(table(["part", "resident", "shared", "private"].concat(S.forked ? ["of it copied"] : []),
        S.parts.filter((p) => p.resident > 0).map((p) => row(label(p.part), p)).concat([row("all heap mappings", S.anonymous)]), "sharing-parts"));
    }
    if (!listed) return;
    s.append(el("h3", {}, "Processes in this trace"));
    const P = R.processes, order = [];
    const known = new Set(P.map((p) => p.pid));
    const visit = (p, depth) => {
      if (order.some(([q]) => q.stream === p.stream)) return;
      order.push([p, depth]);
      for (const c of P.filter((c) => c.forked_from === p.pid)) visit(c, depth + 1);
    };
    for (const p of P.filter((p) => p.forked_from === null || !known.has(p.forked_from))) visit(p, 0);
    for (const p of P) visit(p, 0);
    const opt = (v) => (v === null || v === undefined ? "\u2013" : bytes(v));
    s.append(table(["pid", "command", "calls", "peak RSS", "RSS", "PSS", "private", "copied", "end"], order.map(([p, depth]) => {
      const sh = p.sharing, ru = sh && sh.rollup;
      return ["\u00a0".repeat(2 * depth) + p.pid + (p.stream === R.stream ? " (this report)" : ""), p.argv.join(" "), count(p.calls), opt(p.peak_rss),
        opt(ru && ru.rss), opt(ru && ru.pss), opt(ru && ru.private), opt(sh && sh.inherited !== null ? sh.anonymous.copied : null), p.end];
    }), "processes"));
  }

  function sitesSection(main, R) {
    const S = R.sites;
    const s = section(main, "Allocation sites", "sites");
    if (S.stacks === "none") { s.append(el("p", { class: "note" }, "No call stacks were recorded (record without --stacks none).")); return; }
    if (S.stacks === "sampled") s.append(el("p", { class: "note" }, "Stacks were sampled: site figures are estimates scaled to the exact totals."));
    const tables = [
      ["pinned waste (pages under " + S.sparse_pct + "% live)", S.by_pinned_waste, 2],
      ["live bytes at " + R.focus_noun, S.by_live_bytes, 1],
      ["bytes allocated over the run", S.by_allocated_bytes, 3],
    ];
    for (const [title, list, col] of tables) {
      if (!list.length) continue;
      s.append(el("h3", {}, "By " + title));
      s.append(table(["site", title.split(" (")[0], "live", "allocations"], list.map((r) => [r[0], bytes(r[col]), bytes(r[1]), count(r[4])]), "sites"));
    }
    const L = R.leaks;
    s.append(el("h3", {}, (L.at_exit ? "Leaked at exit: " : "Live when the trace ends: ") + bytes(L.leaked_bytes) + " in " + count(L.leaked_blocks) + " blocks"));
    if (L.inherited_live_blocks) s.append(el("p", { class: "note" }, "Not counted: " + bytes(L.inherited_live_bytes) + " in " + count(L.inherited_live_blocks) + " blocks inherited from its parent at the fork and kept."));
    if (S.by_leaked_bytes.length) s.append(table(["site", "leaked", "allocations"], S.by_leaked_bytes.map((r) => [r[0], bytes(r[6]), count(r[4])]), "sites"));
    s.append(el("h3", {}, "Temporary allocations: " + count(L.temporary_allocations) + " of " + count(L.allocations) + " (freed by their thread before it allocated anything else)"));
    if (S.by_temporary_allocations.length) s.append(table(["site", "temporary", "allocations"], S.by_temporary_allocations.map((r) => [r[0], count(r[7]), count(r[4])]), "sites"));
    if (L.temporary_allocations > 0) s.append(el("p", { class: "note" }, "A temporary block placed between long-lived ones is what leaves them scattered over pages once it is freed: allocating such blocks from a separate arena, or on the stack, keeps the survivors packed."));
    flameGraph(s, R.flame, "Flame graph", [[0, "bytes allocated"], [1, "live at " + R.focus_noun], [2, "pinned waste"]]);
  }

  // An SBCL process's Lisp allocation sites: functions that allocate, with their callers.
  function lispSection(main, R) {
    const L = R.lisp_sites;
    if (!L) return;
    const s = section(main, "Lisp allocation sites", "lisp-sites");
    s.append(el("p", { class: "note" }, bytes(Math.round(L.allocated_bytes)) + " allocated by Lisp code, estimated from " + count(L.samples) + " allocation regions of at most " + bytes(L.region_bytes) +
      " sampled as they were refilled (" + count(L.large_samples) + " of them large objects). Expand a function for its callers."));
    const fn = (y) => (y.callers.length ? el("details", {}, el("summary", {}, y.function), ...y.callers.map((c) => el("div", { class: "caller" }, "\u2190 " + c))) : y.function);
    const est = (v) => bytes(Math.round(v));
    const share = (v) => (100 * v).toFixed(1) + "%";
    s.append(table(["function", "allocated", "share"], L.sites.map((y) => [fn(y), est(y.allocated_bytes), share(y.share)]), "lisp-sites"));
    s.append(el("h3", {}, "Functions by bytes allocated while they ran"));
    s.append(table(["function", "inclusive", "share", "itself", "share"], L.functions.slice(0, 10).map((f) => [f.function, est(f.inclusive_bytes), share(f.inclusive_share), est(f.leaf_bytes), share(f.leaf_share)]), "lisp-functions"));
    if (L.problem) s.append(el("p", { class: "warn" }, L.problem));
    if (R.lisp_flame) flameGraph(s, R.lisp_flame, "Lisp flame graph", [[0, "bytes allocated"]]);
  }

  function flameGraph(parent, F, title, METRICS) {
    parent.append(el("h2", {}, title));
    if (!F.root[4].length) { parent.append(el("p", { class: "note" }, "No site stacks in this report.")); return; }
    const names = F.names;
    function build(a, parent) {
      const n = { name: names[a[0]], v: [a[1], a[2], a[3]], parent, kids: [] };
      n.kids = a[4].map((k) => build(k, n));
      return n;
    }
    const root = build(F.root, null);
    let metric = 0, zoom = root, query = "";
    const W = 1160, ROW = 18;
    const holder = el("div", { class: "flame-holder" });
    const status = el("span", { class: "note" });
    const search = el("input", { type: "search", placeholder: "search functions, files", size: 30 });
    const reset = el("button", { type: "button" }, "reset zoom");
    parent.append(el("div", { class: "controls" }, "value ", select(METRICS, 0, (v) => { metric = +v; zoom = root; draw(); }), search, reset, status));
    parent.append(holder);
    search.addEventListener("input", () => { query = search.value.toLowerCase(); draw(); });
    reset.addEventListener("click", () => { zoom = root; draw(); });
    function depthOf(n) { let d = 0; while (n.parent) { d++; n = n.parent; } return d; }
    function maxDepth(n) { return 1 + Math.max(0, ...n.kids.filter((k) => k.v[metric] > 0).map(maxDepth)); }
    function draw() {
      holder.replaceChildren();
      const total = zoom.v[metric];
      const z0 = depthOf(zoom);
      const rows = z0 + maxDepth(zoom);
      const H = rows * ROW + 4;
      const svg = sv("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "flame" });
      svg.style.maxWidth = "100%";
      svg.style.height = "auto";
      let matched = 0;
      const rect = (n, x, w, d, isAncestor) => {
        const g = sv("g", { class: "frame", "aria-label": n.name });
        const match = query && n.name.toLowerCase().includes(query);
        const r = sv("rect", { x: x.toFixed(2), y: d * ROW, width: Math.max(0.5, w).toFixed(2), height: ROW - 1, fill: isAncestor ? "#e5e7eb" : "hsl(" + (hue(n.name) % 50 + 5) + ",80%," + (60 + hue(n.name) % 15) + "%)" });
        if (match) r.setAttribute("class", "match");
        g.append(r);
        const chars = Math.floor((w - 6) / 6.6);
        if (chars >= 3) g.append(sv("text", { x: (x + 3).toFixed(2), y: d * ROW + 13 }, n.name.length > chars ? n.name.slice(0, chars - 1) + "\u2026" : n.name));
        g.addEventListener("click", () => { zoom = n; draw(); });
        g.addEventListener("mousemove", (ev) => showTip(ev, tipTable(n.name, METRICS.map(([i, label]) => [label, bytes(n.v[i]) + " (" + pct(n.v[i], root.v[i]) + ")"]))));
        g.addEventListener("mouseleave", hideTip);
        svg.append(g);
        return match;
      };
      // The zoomed node's ancestors span the width.
      let a = zoom.parent, d = z0 - 1;
      while (a) { rect(a, 0, W, d, true); a = a.parent; d--; }
      const walk = (n, x, d, inMatch) => {
        const w = total > 0 ? W * n.v[metric] / total : 0;
        if (w < 0.3) return;
        const m = rect(n, x, w, d, false);
        if (m && !inMatch) matched += n.v[metric];
        let cx = x;
        for (const k of n.kids) { walk(k, cx, d + 1, inMatch || m); cx += total > 0 ? W * k.v[metric] / total : 0; }
      };
      walk(zoom, 0, z0, false);
      holder.append(svg);
      status.textContent = query ? "matched " + bytes(matched) + " (" + pct(matched, total) + " of the view)" : total > 0 ? "" : "nothing to show for this value";
    }
    draw();
  }

  function malloc(main, R) {
    document.title = "fragscope: " + R.argv.join(" ");
    document.getElementById("title").textContent = "fragscope report: " + R.argv.join(" ");
    document.getElementById("subtitle").textContent = "pid " + R.pid + (R.allocator ? ", " + R.allocator : "") + ", " + count(R.calls) + " calls, " + secs(R.duration_ms) + " - " + R.trace;
    const h = section(main, "Summary", "summary");
    if (R.truncated) h.append(el("p", { class: "warn" }, "The trace is truncated (" + (R.damage || "no end marker") + "): this is the analysis of what is intact."));
    if (R.skipped) h.append(el("p", { class: "warn" }, "Note: " + R.skipped + "."));
    const M = R.merge;
    if (M && M.attached) h.append(el("p", { class: "note" }, M.starting_blocks !== null
      ? "Recorded from the moment fragscope attached to the running process; its heap then held " + count(M.starting_blocks) + " blocks (" + bytes(M.starting_bytes) + "), read from glibc's heap, which count as live data from the start" + (M.unknown_frees ? " (" + count(M.unknown_frees) + " frees of blocks whose allocation was in flight as its calls were rebound or put back are counted apart)." : ".")
      : "Recorded from the moment fragscope attached to the running process, whose heap was not read then: its " + count(M.unknown_frees) + " frees of blocks allocated before are counted apart, and live data counts only blocks allocated since."));
    if (M && M.inherited_blocks !== null && M.inherited_blocks !== undefined) h.append(el("p", { class: "note" }, "Started from its parent's heap " + (M.inherited_from_parent_end ? "as the parent's calls end in this cut trace, before the fork" : "at the fork") + " (pid " + M.forked_from + "): " + count(M.inherited_blocks) + " blocks (" + bytes(M.inherited_bytes) + "), which count as live data from the start and whose frees are known" + (M.inherited_stale ? " (" + count(M.inherited_stale) + " of them had been freed around the fork with no record: their addresses were allocated again)." : ".")));
    if (M && M.inherited_frees) h.append(el("p", { class: "note" }, count(M.inherited_frees) + " frees of blocks this process inherited from its parent (pid " + M.forked_from + ") at the fork are counted apart; the blocks it inherited and kept are not in its live data."));
    for (const u of R.untraced || []) h.append(el("p", { class: "warn" }, "Not traced, its calls are missing: pid " + u.pid + " (" + (u.argv.join(" ") || u.path) + ")" + (u.exec_by_pid === null ? "" : ", exec'd by pid " + u.exec_by_pid) + ": " + u.reason));
    h.append(el("p", { class: "headline" }, R.headline.sentence));
    h.append(el("p", { class: "note" }, (R.headline.peak_rss === null ? "no RSS sample was taken" : "peak RSS " + bytes(R.headline.peak_rss) + " at " + secs(R.headline.peak_rss_t_ms)) + (R.headline.peak_live === null ? "; peak live unknown (the heap was not read)" : "; peak live " + bytes(R.headline.peak_live) + " at " + secs(R.headline.peak_live_t_ms)) +
      (R.headline.fragmentation_ratio ? "; fragmentation ratio " + R.headline.fragmentation_ratio.toFixed(2) + " (heap resident / live at " + R.focus_phrase + ")" : "")));
    // The heaps apart at the most waste, when the process has more than one.
    const F = R.focus_snapshot;
    if (F !== null && F !== undefined && R.snapshots.heaps[F].length > 1) {
      h.append(el("p", { class: "note" }, "At " + secs(R.snapshots.t_ms[F]) + " (" + R.focus_phrase + "): " + R.snapshots.heaps[F].filter((x) => x.resident > 0).map((x) => R.heap_names[x.heap] + " " + bytes(x.resident) + " resident for " + bytes(x.live) + " live").join("; ") + "."));
    }
    // A snapshot of the same moment (to 10 ms) that saw far less live data was read after
    // the frees that followed the peak: both times to the millisecond, as in the text.
    const S = R.snapshots, pl = R.headline.peak_live, pt = R.headline.peak_live_t_ms;
    const near = pl === null || R.calls === 0 ? -1 : S.t_ms.findIndex((t, i) => Math.abs(t - pt) < 10 && S.parts.live[i] !== null && S.parts.live[i] < 0.9 * pl);
    if (near >= 0) h.append(el("p", { class: "note" }, "Live data peaked at " + bytes(pl) + " at " + (pt / 1000).toFixed(3) + " s, between two calls; the snapshot at " + (S.t_ms[near] / 1000).toFixed(3) + " s was read after the calls of its millisecond, " + bytes(S.parts.live[near]) + " live."));
    if (R.snapshot) snapshotSection(main, R.snapshot);
    const d = section(main, "Where the RSS went", "decomposition");
    d.append(el("p", { class: "note" }, "RSS split at each page-residency snapshot (ticks under the axis), with RSS every 10 ms as a line; shaded bands are the detected phases. Hover for values."));
    decompositionChart(d, R);
    sharingSection(main, R);
    occupancySection(main, R);
    pymallocSection(main, R);
    goSection(main, R);
    jvmSection(main, R);
    v8Section(main, R);
    lispSection(main, R);
    // A Go program without cgo made no malloc call: malloc's classes and sites are empty.
    if (R.calls === 0 && R.go) return;
    sizeClassSection(main, R);
    sitesSection(main, R);
  }

  // A `fragscope snapshot` of a running process: how it was read, and the allocator's heap.
  function snapshotSection(main, P) {
    const s = section(main, "Snapshot of a running process", "snapshot");
    s.append(el("p", { class: P.stopped ? "note" : "warn" }, P.stopped
      ? "The process (" + P.allocator + ") was stopped for " + P.pause_ms.toFixed(1) + " ms while it was read. A snapshot has no history: no allocation sites."
      : "Read without stopping the process (--no-stop): the figures may not hold together. A snapshot has no history: no allocation sites."));
    if (P.note) s.append(el("p", { class: "warn" }, P.note));
    const g = P.glibc;
    if (!g) return;
    s.append(el("p", { class: "note" }, "glibc " + g.version + " malloc, read from " + g.layout_source + ". In use " + bytes(g.in_use_bytes) + " in " + count(g.in_use_chunks) + " chunks (" + bytes(g.mmapped_bytes) + " mmapped); free " +
      bytes(g.free_bytes + g.fastbin_bytes + g.tcache_bytes + g.top_bytes) + " (bins " + bytes(g.free_bytes) + ", fastbins " + bytes(g.fastbin_bytes) + ", threads' caches " + bytes(g.tcache_bytes) + ", tops " + bytes(g.top_bytes) +
      "). As mallinfo2 counts it: uordblks + hblkhd " + bytes(g.mallinfo_in_use) + ", fordblks " + bytes(g.mallinfo_free) + ". malloc_trim(0) would return " + bytes(g.trimmable_bytes) + " (predicted, not done)."));
    s.append(table(["arena", "threads", "heaps", "system", "in use", "free", "resident", "free in used pages", "free pages", "trimmable"],
      g.arenas.map((a, i) => [a.main ? "main" : "#" + i, count(a.threads), count(a.heaps), bytes(a.system_mem), bytes(a.in_use_bytes),
        bytes(a.free_bytes + a.fastbin_bytes + a.tcache_bytes + a.top_bytes), bytes(a.resident_bytes), bytes(a.free_in_used_pages), bytes(a.free_pages_bytes), bytes(a.trimmable_bytes)])));
  }

  // ---- GHC programs ----
  function ghc(main, G) {
    document.title = "fragscope: " + (G.argv.join(" ") || G.source);
    document.getElementById("title").textContent = "fragscope report: " + G.source + " (GHC program)";
    document.getElementById("subtitle").textContent = [G.argv.join(" "), G.ghc_version ? "GHC " + G.ghc_version : "", G.rts || "", secs(G.duration_ms)].filter((x) => x).join(" - ");
    const h = section(main, "Summary", "summary");
    if (G.truncated) h.append(el("p", { class: "warn" }, "The eventlog is cut (" + (G.damage || "") + "): this is what is intact."));
    for (const n of G.notes) h.append(el("p", { class: "note" }, n));
    if (!G.rss_recorded) h.append(el("p", { class: "note" }, "An eventlog read on its own has no RSS."));
    if (G.diagnosis) {
      h.append(el("p", { class: "headline" }, G.diagnosis.headline));
      for (const d of G.diagnosis.details) h.append(el("p", {}, d));
      const ul = el("ul", { class: "advice" });
      for (const a of G.diagnosis.advice) ul.append(el("li", {}, a));
      h.append(ul);
    } else if (G.headline) {
      h.append(el("p", { class: "headline" }, G.headline));
    }
    ghcTimeline(section(main, "Heap over time", "ghc-timeline"), G, { height: 320 });
    const b = section(main, "Closure types by phase (-hT)", "closure-types");
    const labels = [];
    for (const p of G.phases) for (const c of p.closure_types) if (!labels.includes(c.label)) labels.push(c.label);
    const color = (l) => (l === "other" ? "#cbd5e1" : PALETTE[labels.indexOf(l) % PALETTE.length]);
    if (!labels.length) b.append(el("p", { class: "note" }, G.eventlog_figures_missing ? "No -hT census: " + G.eventlog_figures_missing + "." : "No -hT census fell inside a phase."));
    else {
      const ymax = Math.max(1, ...G.phases.map((p) => p.closure_types.reduce((a, c) => a + c.bytes, 0)));
      const c = timeChart(b, { tmax: Math.max(G.duration_ms, 1), ymax, height: 260, cls: "closure-bands" });
      for (const p of G.phases) {
        let acc = 0;
        const x0 = c.x(p.start_ms), w = Math.max(1, c.x(p.end_ms) - x0 - 1);
        for (const ct of p.closure_types) {
          const r = sv("rect", { class: "band", x: x0, y: c.y(acc + ct.bytes), width: w, height: Math.max(0, c.y(acc) - c.y(acc + ct.bytes)), fill: color(ct.label) });
          r.addEventListener("mousemove", (ev) => showTip(ev, tipTable(ct.label, [["bytes", bytes(ct.bytes)], ["phase", p.kind + " " + secs(p.start_ms) + " - " + secs(p.end_ms)]])));
          r.addEventListener("mouseleave", hideTip);
          c.svg.append(r);
          acc += ct.bytes;
        }
      }
      b.append(legend(labels.map((l) => [l, color(l)])));
      for (const p of G.phases) if (p.pinned_note) b.append(el("p", { class: "note" }, p.pinned_note));
    }
    ghcBlockCensus(main, G);
    const ph = section(main, "Phases", "ghc-phases");
    const phase = (p) => p.kind + " " + secs(p.start_ms) + " - " + secs(p.end_ms);
    if (!G.heap_known) {
      // The heap's columns would be empty in every row: one line says why instead.
      ph.append(el("p", { class: "note" }, "No heap figures: " + missingFigures(G) + "; the phases show RSS."));
      ph.append(table(["phase", "RSS max", "RSS", "lazily freed", "file"], G.phases.map((p) => {
        const d = p.decomposition;
        return [phase(p), bytes(p.rss_max), bytes(d.rss), bytes(d.lazy_free), bytes(d.file)];
      })));
    } else {
      ph.append(table(["phase", "RSS max", "live", "copy reserve + slop", "free blocks", "lazily freed", "other anon", "file"], G.phases.map((p) => {
        const d = p.decomposition;
        return [phase(p), bytes(p.rss_max), bytes(d.live), bytes(d.copy_reserve_and_slop) + (d.to_space === null || d.to_space === undefined ? "" : " (to-space of a collection in progress: " + bytes(d.to_space) + ")"), bytes(d.free_resident_pages), bytes(d.lazy_free), bytes(d.other_anon), bytes(d.file)];
      })));
    }
    const gc = section(main, "Garbage collection", "gc");
    const g = G.gc;
    if (!g.generations.length) {
      gc.append(el("p", { class: "note" }, "No GC figures: " + missingFigures(G) + "."));
      return;
    }
    const known = (v, f) => (v === null || v === undefined ? "-" : f(v));
    gc.append(table(["generation", "collections", "copied", "GC time", "max pause"], g.generations.map((x) => ["gen " + x.generation, count(x.collections), bytes(x.copied_bytes), duration(x.gc_ms), duration(x.max_pause_ms)])));
    gc.append(el("p", { class: "note" }, "allocated " + bytes(g.allocated_bytes) + ", copied " + bytes(g.copied_bytes) + ", maximum residency " + bytes(g.max_residency) + ", memory in use " + bytes(g.memory_in_use) + "; mutator " + known(g.mutator_ms, secs) + ", GC " + known(g.gc_ms, secs)));
  }

  // Why the eventlog's figures are missing, for the line that stands in for them.
  function missingFigures(G) {
    return G.eventlog_figures_missing || "the eventlog holds none";
  }

  // Live data, blocks, heap size and (when recorded) RSS over time.
  function ghcTimeline(parent, G, o) {
    const T = G.timeline;
    const ts = T.map((p) => p.t_ms);
    const series = [
      { name: "live (HEAP_LIVE)", values: T.map((p) => p.live), color: "#3b82f6" },
      { name: "blocks (BLOCKS_SIZE)", values: T.map((p) => p.blocks_size), color: "#10b981" },
      { name: "heap size (megablocks)", values: T.map((p) => p.heap_size), color: "#f59e0b" },
    ];
    if (G.rss_recorded) {
      series.push({ name: "RSS", values: T.map((p) => p.rss), color: "#111" });
      series.push({ name: "RSS minus LazyFree", values: T.map((p) => p.rss_minus_lazy_free), color: "#ef4444", dashed: true });
    }
    // Unknown figures are null: their series is left out, not drawn at 0.
    if (!T.some((p) => p.live !== null || p.heap_size !== null)) parent.append(el("p", { class: "note" }, "No live data or heap size: " + missingFigures(G) + "."));
    linesChart(parent, { tmax: o.tmax || Math.max(G.duration_ms, ...ts, 1), ymax: o.ymax, width: o.width, ts, series: series.filter((x) => x.values.some((v) => v !== null)), phases: G.phases, cls: "ghc-lines", lineClass: "ghc-line", height: o.height });
  }

  // The RTS's block censuses: figures over time beside the eventlog's, and the census the
  // diagnosis reads in detail (blocks by kind, megablock fill, pinned-block occupancy).
  function ghcBlockCensus(main, G) {
    const C = G.block_censuses;
    if (!C.length) return;
    const s = section(main, "Block census", "ghc-blocks");
    s.append(el("p", { class: "note" }, "Read from the RTS's block descriptors at each snapshot, with the program stopped meanwhile; HEAP_SIZE and GC frag are the eventlog's figures posted at the last collection before."));
    const ts = C.map((c) => c.t_ms);
    linesChart(s, { tmax: Math.max(G.duration_ms, ...ts, 1), ts, series: [
      { name: "heap (megablocks)", values: C.map((c) => c.heap_size), color: "#f59e0b" },
      { name: "blocks in use", values: C.map((c) => c.blocks_in_use), color: "#10b981" },
      { name: "free blocks", values: C.map((c) => c.free_blocks), color: "#ef4444" },
      { name: "sparse megablocks (at most 25 blocks in use)", values: C.map((c) => c.sparse_megablocks), color: "#8b5cf6", dashed: true },
    ], phases: G.phases, cls: "ghc-lines", lineClass: "ghc-line", height: 240 });
    const pinnedHeld = (c) => (c.kinds.find((k) => k.kind === "pinned") || { held: 0 }).held;
    s.append(table(["time", "heap", "HEAP_SIZE", "in use", "free blocks", "GC frag", "pinned", "pinned live", "sparse megablocks", "pause"], C.map((c) => [
      secs(c.t_ms), bytes(c.heap_size), bytes(c.eventlog_heap_size), bytes(c.blocks_in_use), bytes(c.free_blocks), c.eventlog_free_blocks === null ? "-" : bytes(c.eventlog_free_blocks),
      bytes(pinnedHeld(c)), c.pinned_live === null ? "-" : bytes(c.pinned_live), bytes(c.sparse_megablocks), c.pause_ms.toFixed(1) + " ms"])));
    const focus = (G.diagnosis && C.find((c) => c.t_ms === G.diagnosis.census_t_ms)) || C[C.length - 1];
    s.append(el("h2", {}, "At " + secs(focus.t_ms)));
    s.append(table(["blocks by kind", "groups", "held", "used"], focus.kinds.filter((k) => k.groups > 0).map((k) => [k.kind, count(k.groups), bytes(k.held), bytes(k.used)])));
    s.append(table(["megablocks by blocks in use (of 252)", "megablocks"], focus.megablock_fill.filter((f) => f.megablocks > 0).map((f) => [f.label, count(f.megablocks)])));
    if (focus.pinned_occupancy) {
      const most = Math.max(1, ...focus.pinned_occupancy);
      s.append(table(["pinned blocks, how full (referred-to bytes / held)", "blocks", ""], focus.pinned_occupancy.map((n, i) => {
        const bar = el("div", { class: "occ-bar" });
        bar.style.width = (100 * n / most).toFixed(1) + "%";
        bar.style.background = "#8b5cf6";
        bar.style.height = "0.8em";
        return [i * 10 + "% - " + (i + 1) * 10 + "%", count(n), bar];
      })));
    }
  }

  // ---- compare ----
  function compare(main, D) {
    const cols = D.columns;
    document.title = "fragscope compare";
    document.getElementById("title").textContent = "fragscope compare";
    document.getElementById("subtitle").textContent = cols.map((c) => c.label).join(" | ");
    const t = section(main, "Side by side", "compare-table");
    const runs = Math.max(1, ...cols.map((c) => c.runs));
    const fmt = (v, f) => (v === null || v === undefined ? "-" : f(v));
    const rows = [
      ["peak RSS", (c) => bytes(c.peak_rss)], ["end RSS", (c) => bytes(c.end_rss)], ["peak live", (c) => bytes(c.peak_live)],
      ["at the most waste: heap resident", (c) => bytes(c.heap_resident)], ["live", (c) => bytes(c.live)], ["rounding", (c) => bytes(c.rounding)],
      ["allocator overhead", (c) => bytes(c.allocator_overhead)], ["free in used pages", (c) => bytes(c.free_in_used_pages)], ["free resident pages", (c) => bytes(c.free_resident_pages)],
      ["lazily freed", (c) => bytes(c.lazy_free)], ["other anonymous", (c) => bytes(c.other_anon)],
      ["fragmentation ratio", (c) => fmt(c.fragmentation_ratio, (r) => r.toFixed(2))],
      ["wall time (recorded)", (c) => fmt(c.wall_ms, secs)], ["CPU time (recorded)", (c) => fmt(c.cpu_ms, secs)],
    ];
    t.append(table([runs > 1 ? "(medians)" : ""].concat(cols.map((c) => c.label)), rows.map(([name, f]) => [name].concat(cols.map(f))), "compare"));
    // The waste at the most-waste snapshot, as stacked bars.
    const keys = ["live", "rounding", "allocator_overhead", "free_in_used_pages", "free_resident_pages", "lazy_free", "other_anon"];
    const W = 1100, H = 60 + cols.length * 34, m = { l: 200, r: 20 };
    const svg = sv("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "chart compare-bars" });
    svg.style.maxWidth = "100%";
    svg.style.height = "auto";
    const xmax = Math.max(1, ...cols.map((c) => keys.reduce((a, k) => a + c[k], 0)));
    cols.forEach((c, i) => {
      let acc = 0;
      const y = 10 + i * 34;
      svg.append(sv("text", { x: m.l - 8, y: y + 17, "text-anchor": "end" }, c.label.length > 30 ? c.label.slice(0, 29) + "\u2026" : c.label));
      for (const k of keys) {
        const w = (W - m.l - m.r) * c[k] / xmax;
        const r = sv("rect", { class: "cmp-bar", x: m.l + (W - m.l - m.r) * acc / xmax, y, width: w, height: 24, fill: PART_COLORS[k] });
        r.addEventListener("mousemove", (ev) => showTip(ev, tipTable(c.label, [[k.replace(/_/g, " "), bytes(c[k]), PART_COLORS[k]]])));
        r.addEventListener("mouseleave", hideTip);
        svg.append(r);
        acc += c[k];
      }
    });
    t.append(el("h2", {}, "At the most waste"));
    t.append(svg);
    t.append(legend(keys.map((k) => [k.replace(/_/g, " "), PART_COLORS[k]])));
    const reports = D.reports.filter((r) => r);
    if (!reports.length) return;
    const ymax = Math.max(0, ...reports.flatMap((R) => R.timeline.rss.concat(R.snapshots.rss)));
    const s = section(main, "Over time", "compare-charts");
    const side = el("div", { class: "side" });
    s.append(side);
    D.reports.forEach((R, i) => {
      if (!R) return;
      const box = el("div", { class: "run" }, el("h3", {}, cols[i].label));
      side.append(box);
      decompositionChart(box, R, { width: 560, height: 260, ymax });
      if (R.focus_snapshot !== null && R.focus_snapshot !== undefined) {
        box.append(el("p", { class: "note" }, "page occupancy at " + secs(R.snapshots.t_ms[R.focus_snapshot]) + " (" + R.focus_phrase + ")"));
        occupancyChart(box, R, R.focus_snapshot, { width: 560, height: 200 });
      }
    });
  }

  // GHC programs side by side: where memory settled, the block census there, the GC table.
  function ghcCompare(main, D) {
    const cols = D.columns;
    document.title = "fragscope compare";
    document.getElementById("title").textContent = "fragscope compare (GHC programs)";
    document.getElementById("subtitle").textContent = cols.map((c) => c.label).join(" | ");
    const t = section(main, "Side by side", "compare-table");
    for (const c of cols) t.append(el("p", { class: c.headline ? "headline" : "note" }, c.label + ": " + (c.headline || (c.census ? "no block-level waste stands out in its block censuses" : "no block census where memory settled"))));
    const fmt = (v, f) => (v === null || v === undefined ? "-" : f(v));
    const cen = (f) => (c) => (c.census ? f(c.census) : "-");
    const rows = [
      ["peak RSS", (c) => fmt(c.peak_rss, bytes)], ["end RSS", (c) => fmt(c.end_rss, bytes)],
      ["maximum residency (live)", (c) => bytes(c.max_residency)], ["memory in use (largest heap)", (c) => bytes(c.memory_in_use)],
      ["where memory settled", (c) => (c.settled_phase ? c.settled_phase + " " + secs(c.settled_start_ms) + " - " + secs(c.settled_end_ms) : "-")],
      ["  read at", (c) => fmt(c.settled_t_ms, secs)],
      ["  RSS", (c) => fmt(c.rss, bytes)], ["  RSS - LazyFree", (c) => fmt(c.rss_minus_lazy_free, bytes)],
      ["  live (HEAP_LIVE)", (c) => bytes(c.live)], ["  heap size (megablocks)", (c) => bytes(c.heap_size)],
      ["  copy reserve and slop", (c) => bytes(c.copy_reserve_and_slop)], ["  free blocks in heap", (c) => bytes(c.free_blocks)],
      ["  lazily freed", (c) => fmt(c.lazy_free, bytes)], ["  other anonymous", (c) => fmt(c.other_anon, bytes)],
      ["block census at", cen((k) => secs(k.t_ms))], ["  heap (megablocks)", cen((k) => bytes(k.heap_size))],
      ["  blocks in use", cen((k) => bytes(k.blocks_in_use))], ["  free blocks", cen((k) => bytes(k.free_blocks))],
      ["  pinned blocks", cen((k) => count(k.pinned_blocks) + " (" + bytes(k.pinned_held) + ")")],
      ["  pinned objects referred to", cen((k) => fmt(k.pinned_live, bytes))],
      ["  megablocks with at most 25 blocks in use", cen((k) => bytes(k.sparse_megablocks))],
      ["major collections", (c) => fmt(c.major_collections, count)], ["minor collections", (c) => fmt(c.minor_collections, count)],
      ["bytes copied", (c) => bytes(c.copied_bytes)], ["bytes allocated", (c) => bytes(c.allocated_bytes)],
      ["GC time", (c) => fmt(c.gc_ms, secs)], ["max pause", (c) => fmt(c.max_pause_ms, duration)],
      ["maximum slop", (c) => fmt(c.max_slop, bytes)],
    ];
    t.append(table([""].concat(cols.map((c) => c.label)), rows.map(([name, f]) => [name].concat(cols.map(f))), "compare"));
    // Where memory settled, as stacked bars of the same parts.
    const keys = [["live", "#3b82f6"], ["copy_reserve_and_slop", "#10b981"], ["free_blocks", "#ef4444"], ["lazy_free", PART_COLORS.lazy_free], ["other_anon", PART_COLORS.other_anon]];
    const W = 1100, H = 20 + cols.length * 34, m = { l: 200, r: 20 };
    const svg = sv("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "chart compare-bars" });
    svg.style.maxWidth = "100%";
    svg.style.height = "auto";
    const val = (c, k) => c[k] || 0;
    // A run without heap figures has no parts to draw: a bar of the few it has would
    // fill the width it is scaled to.
    const xmax = Math.max(1, ...cols.filter((c) => c.heap_known).map((c) => keys.reduce((a, [k]) => a + val(c, k), 0)));
    cols.forEach((c, i) => {
      let acc = 0;
      const y = 10 + i * 34;
      svg.append(sv("text", { x: m.l - 8, y: y + 17, "text-anchor": "end" }, c.label.length > 30 ? c.label.slice(0, 29) + "\u2026" : c.label));
      if (!c.heap_known) {
        svg.append(sv("text", { x: m.l, y: y + 17, fill: "#64748b" }, "no heap figures: RSS is not split"));
        return;
      }
      for (const [k, color] of keys) {
        // An unknown part draws nothing.
        if (c[k] === null || c[k] === undefined) continue;
        const w = (W - m.l - m.r) * val(c, k) / xmax;
        const r = sv("rect", { class: "cmp-bar", x: m.l + (W - m.l - m.r) * acc / xmax, y, width: w, height: 24, fill: color });
        r.addEventListener("mousemove", (ev) => showTip(ev, tipTable(c.label, [[k.replace(/_/g, " "), bytes(c[k]), color]])));
        r.addEventListener("mouseleave", hideTip);
        svg.append(r);
        acc += val(c, k);
      }
    });
    t.append(el("h2", {}, "Where memory settled"));
    t.append(svg);
    t.append(legend(keys.map(([k, color]) => [k.replace(/_/g, " "), color])));
    // The pinned-block histograms of the censuses, one column per run.
    if (cols.some((c) => c.census && c.census.pinned_occupancy)) {
      t.append(el("h2", {}, "Pinned blocks by how full they are (referred-to bytes / held)"));
      const most = Math.max(1, ...cols.flatMap((c) => (c.census && c.census.pinned_occupancy) || []));
      t.append(table(["how full"].concat(cols.map((c) => c.label)), [...Array(10).keys()].map((i) => [i * 10 + "% - " + (i + 1) * 10 + "%"].concat(cols.map((c) => {
        const occ = c.census && c.census.pinned_occupancy;
        if (!occ) return "-";
        const bar = el("div", { class: "occ-bar" });
        bar.style.width = (100 * occ[i] / most).toFixed(1) + "%";
        bar.style.background = "#8b5cf6";
        bar.style.height = "0.8em";
        return el("div", {}, count(occ[i]), bar);
      }))), "compare"));
    }
    const reports = D.reports.filter((r) => r);
    if (!reports.length) return;
    const tmax = Math.max(1, ...reports.map((G) => G.duration_ms));
    const ymax = Math.max(1, ...reports.flatMap((G) => G.timeline.flatMap((p) => [p.live || 0, p.heap_size || 0, p.rss || 0])));
    const s = section(main, "Over time", "compare-charts");
    const side = el("div", { class: "side" });
    s.append(side);
    D.reports.forEach((G, i) => {
      if (!G) return;
      const box = el("div", { class: "run" }, el("h3", {}, cols[i].label));
      side.append(box);
      ghcTimeline(box, G, { width: 560, height: 260, tmax, ymax });
    });
  }

  try {
    const D = JSON.parse(document.getElementById("data").textContent);
    const main = document.getElementById("main");
    main.replaceChildren();
    if (D.kind === "malloc") malloc(main, D.report);
    else if (D.kind === "ghc") ghc(main, D.report);
    else if (D.kind === "compare") compare(main, D);
    else if (D.kind === "ghc_compare") ghcCompare(main, D);
    else fail("unknown report kind");
  } catch (e) {
    fail("error: " + (e && e.stack ? e.stack : e));
  }
  document.documentElement.dataset.resources = String(performance.getEntriesByType("resource").length);
  document.documentElement.dataset.rendered = errors.length ? "failed" : "ok";
})();
