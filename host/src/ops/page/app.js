// The live page: polls /v1/page every second and redraws. Every text from
// the server goes through textContent, never innerHTML: tenant, table and
// reason strings are other people's input.
"use strict";

const POLL_MS = 1000;
const LETTERS_MS = 5000;
// Five minutes of one-second samples, per unit (the host keeps the total's).
const HISTORY = 300;
// Distinct hues for members, handed out in order of first sight so a
// member keeps its colour while others come and go.
const PALETTE = ["#58a6ff", "#f0883e", "#3fb950", "#d2a8ff", "#ffa657", "#79c0ff",
  "#ff7b72", "#56d4dd", "#e3b341", "#a5d6ff", "#bc8cff", "#7ee787"];
const colours = new Map();
const history = new Map(); // consumer -> [pending…]
let admin = false;
let lettersTimer = null;

const $ = (id) => document.getElementById(id);

function colour(member) {
  if (!member) return "";
  if (!colours.has(member)) colours.set(member, PALETTE[colours.size % PALETTE.length]);
  return colours.get(member);
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmt(n) {
  if (n === null || n === undefined) return "–";
  if (n >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return String(n);
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function age(ms) {
  const s = Math.floor(ms / 1000);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.floor(s / 60) + " min";
  return Math.floor(s / 3600) + " h";
}

function message(text) {
  const m = $("message");
  m.textContent = text || "";
  m.hidden = !text;
}

function push(series, value) {
  series.push(value);
  if (series.length > HISTORY) series.shift();
}

// One line over a canvas, scaled to its own maximum (at least 1).
function line(canvas, series, stroke) {
  lines(canvas, [[series, stroke]]);
}

// Lines over a canvas, scaled to their common maximum (at least 1).
function lines(canvas, drawn) {
  const ratio = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(canvas.clientWidth * ratio));
  const h = Math.max(1, Math.round(canvas.clientHeight * ratio));
  if (canvas.width !== w) canvas.width = w;
  if (canvas.height !== h) canvas.height = h;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(1, ...drawn.flatMap(([series]) => series));
  for (const [series, stroke] of drawn) {
    if (series.length < 2) continue;
    ctx.strokeStyle = stroke;
    ctx.lineWidth = Math.max(1, ratio * 1.5);
    ctx.beginPath();
    series.forEach((v, i) => {
      const x = (w * (HISTORY - series.length + i)) / (HISTORY - 1);
      const y = h - 2 - ((h - 4) * v) / max;
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
  return max;
}

// "4 min 59 s" for a span in milliseconds.
function span(ms) {
  const s = Math.round(ms / 1000);
  return s < 60 ? s + " s" : Math.floor(s / 60) + " min " + (s % 60) + " s";
}

// Rows a sample counts since the one before, per second of that interval.
function perSecond(samples, key) {
  return samples.map((s, i) => {
    const ms = i > 0 ? s.at_ms - samples[i - 1].at_ms : 1000;
    return ms > 0 ? Math.round((s[key] || 0) * 1000 / ms) : 0;
  });
}

function drawTotals(state) {
  // A unit NATS did not answer for makes the sums unknown (–), not smaller.
  const known = state.units.every((u) => u.pending != null && u.ack_pending != null);
  const backlog = known ? state.units.reduce((s, u) => s + u.pending, 0) : null;
  const inFlight = known ? state.units.reduce((s, u) => s + u.ack_pending, 0) : null;
  const fleet = state.totals || {};
  const box = $("totals");
  box.replaceChildren();
  for (const [label, value] of [
    ["members", state.fleet.members.length],
    ["units", state.units.length],
    ["unowned", state.fleet.unowned.length],
    ["backlog", backlog],
    ["in flight", inFlight],
    ["accepted", fleet.accepted],
    ["delivered", fleet.delivered],
    ["dead-lettered", fleet.dead_lettered],
  ]) {
    const t = el("div", null, "total");
    t.append(el("b", fmt(value)), el("span", label, "muted"));
    box.append(t);
  }
  // Kept by the host, not this page: a page opened now shows the past too.
  const samples = state.queued_history || [];
  const queued = samples.map((s) => s.queued_rows);
  const accepted = perSecond(samples, "accepted_rows");
  const delivered = perSecond(samples, "delivered_rows");
  $("lag-max").textContent = fmt(Math.max(1, ...queued));
  $("rates-max").textContent = fmt(Math.max(1, ...accepted, ...delivered));
  line($("lag"), queued, "#58a6ff");
  lines($("rates"), [[accepted, "#58a6ff"], [delivered, "#3fb950"]]);
  // What the charts cover, in the DOM too (for a reader, and for a test).
  const from = samples.length ? samples[0].at_ms : 0;
  const to = samples.length ? samples[samples.length - 1].at_ms : 0;
  for (const canvas of [$("lag"), $("rates")]) {
    canvas.dataset.samples = String(samples.length);
    canvas.dataset.fromMs = String(from);
    canvas.dataset.toMs = String(to);
  }
  $("rates").dataset.accepted = String(samples.reduce((n, s) => n + (s.accepted_rows || 0), 0));
  $("rates").dataset.delivered = String(samples.reduce((n, s) => n + (s.delivered_rows || 0), 0));
  $("history-span").textContent = samples.length < 2 ? "no samples yet"
    : "last " + span(to - from) + ", " + samples.length + " samples, from "
      + new Date(from).toLocaleTimeString() + " to " + new Date(to).toLocaleTimeString();
}

function drawMembers(state) {
  const box = $("members");
  box.replaceChildren();
  const units = new Map();
  for (const u of state.units) {
    if (u.owner) units.set(u.owner, (units.get(u.owner) || []).concat(u.consumer));
  }
  const members = [...state.fleet.members].sort((a, b) => a.id.localeCompare(b.id));
  for (const m of members) {
    const card = el("div", null, "member");
    card.dataset.member = m.id;
    card.style.borderLeftColor = colour(m.id);
    const title = el("h3", m.id);
    if (m.id === state.fleet.me) title.append(el("span", " (this host)", "muted"));
    // Overdue renewal: seconds before the key expires and its units move.
    if (m.late) {
      card.classList.add("late");
      title.append(el("span", " late: no renewal for " + age(m.renewed_ms_ago), "late"));
    }
    card.append(title);
    const owned = units.get(m.id) || [];
    card.append(el("div", owned.length + " units · up " + age(m.age_ms) + " · " + m.http, "muted"));
    const plugins = el("ul");
    for (const [name, version] of Object.entries(m.plugins || {})) {
      plugins.append(el("li", name + " " + version));
    }
    card.append(plugins);
    card.dataset.units = owned.join(" ");
    box.append(card);
  }
}

function drawGrid(state) {
  const grid = $("grid");
  grid.style.gridTemplateColumns = "2.5rem repeat(" + Math.max(1, state.shards) + ", minmax(4.5rem, 1fr))";
  grid.replaceChildren(el("div", "", "axis"));
  for (let s = 0; s < state.shards; s++) grid.append(el("div", "shard " + s, "axis"));
  const seen = new Set();
  for (let p = 0; p < state.partitions; p++) {
    grid.append(el("div", "p" + p, "axis"));
    for (const u of state.units.filter((u) => u.partition === p).sort((a, b) => a.shard - b.shard)) {
      seen.add(u.consumer);
      const series = history.get(u.consumer) || [];
      if (u.pending != null) push(series, u.pending);
      history.set(u.consumer, series);
      const cell = el("div", null, "cell");
      cell.dataset.unit = u.consumer;
      cell.dataset.owner = u.owner || "";
      cell.title = u.consumer + (u.owner ? " — " + u.owner : " — unowned");
      if (u.owner) cell.style.background = colour(u.owner);
      cell.append(el("span", u.owner || "unowned", "who"),
        el("span", fmt(u.pending) + (u.ack_pending ? " +" + fmt(u.ack_pending) : ""), "lag"));
      const spark = el("canvas");
      cell.append(spark);
      grid.append(cell);
      // Drawn once in the document, when it has a size.
      requestAnimationFrame(() => line(spark, series, u.owner ? "#0b0e12" : "#e6e9ee"));
    }
  }
  for (const consumer of [...history.keys()]) if (!seen.has(consumer)) history.delete(consumer);
}

// A running canary as two rows (release, candidate), and how the last
// canary of each plugin ended, and why.
function drawCanaries(state) {
  const body = $("canary-rows");
  const ends = $("canary-ends");
  body.replaceChildren();
  ends.replaceChildren();
  const rate = (n, rows) => fmt(n) + (rows ? " (" + (100 * n / rows).toFixed(2) + "%)" : "");
  for (const p of state.plugins || []) {
    const c = p.canary;
    const d = c && c.shadow;
    // A shadow serves no tenant: its differences, not two versions' rows.
    if (d) {
      const differ = Object.values(d.classes || {}).reduce((sum, k) => sum + k.rows, 0);
      ends.append(el("li", p.name + ": shadow " + c.version + " beside " + p.version + ": compared " +
        fmt(d.compared) + " rows, " + fmt(differ) + " differ, " + fmt(d.skipped) + " not compared (weir plugin diff " + p.name + ")"));
    } else if (c) {
      for (const [version, serves, t] of [[p.version, "the others", c.serving], [c.version, c.serves, c.candidate]]) {
        const row = el("tr");
        row.dataset.plugin = p.name;
        row.append(el("td", p.name), el("td", version), el("td", serves), el("td", fmt(t.rows), "num"),
          el("td", rate(t.dead_letters, t.rows), "num"), el("td", rate(t.traps, t.rows), "num"),
          el("td", rate(t.deadlines, t.rows), "num"));
        body.append(row);
      }
    }
    const e = p.last_canary;
    if (e) ends.append(el("li", p.name + ": last canary " + e.digest.slice(0, 12) + " " +
      (e.outcome === "promoted" ? "promoted" : "rolled back") + " (" + e.by + "): " + e.reason));
  }
  $("canaries").hidden = !body.children.length && !ends.children.length;
}

function drawTenants(state) {
  $("tenants").hidden = !state.tenants;
  const body = $("tenant-rows");
  body.replaceChildren();
  for (const t of state.tenants || []) {
    const row = el("tr");
    row.dataset.tenant = t.tenant;
    row.append(el("td", t.tenant), el("td", fmt(t.queued_rows), "num"), el("td", bytes(t.queued_bytes), "num"),
      el("td", fmt(t.recent_rows), "num"), el("td", bytes(t.recent_bytes), "num"));
    body.append(row);
  }
}

function setAdmin(on) {
  if (on === admin) return;
  admin = on;
  $("login").hidden = on;
  $("logout").hidden = !on;
  $("letters").hidden = !on;
  if (on) {
    loadLetters();
    lettersTimer = setInterval(loadLetters, LETTERS_MS);
  } else {
    clearInterval(lettersTimer);
    $("letter-rows").replaceChildren();
  }
}

async function poll() {
  try {
    const response = await fetch("/v1/page", { cache: "no-store" });
    if (!response.ok) throw new Error("status " + response.status);
    const state = await response.json();
    $("me").textContent = state.fleet.me;
    const health = $("health");
    const answered = state.nats_connected && state.nats_answered !== false;
    health.dataset.state = answered ? "ok" : "bad";
    health.textContent = answered
      ? "live · " + new Date().toLocaleTimeString()
      : state.nats_connected ? "NATS not answering" : "NATS disconnected";
    setAdmin(state.admin);
    drawTotals(state);
    drawMembers(state);
    drawGrid(state);
    drawCanaries(state);
    drawTenants(state);
    document.body.dataset.updated = String(Date.now());
  } catch (err) {
    const health = $("health");
    health.dataset.state = "bad";
    health.textContent = "host unreachable";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

async function loadLetters() {
  try {
    const response = await fetch("/v1/page/dead-letters", { cache: "no-store" });
    if (response.status === 401) { setAdmin(false); return; }
    if (!response.ok) throw new Error((await response.json()).error);
    const { letters } = await response.json();
    const body = $("letter-rows");
    body.replaceChildren();
    if (letters.length === 0) {
      const row = el("tr");
      const cell = el("td", "none", "muted");
      cell.colSpan = 6;
      row.append(cell);
      body.append(row);
    }
    for (const l of letters) {
      const row = el("tr");
      row.dataset.sequence = l.sequence;
      const plugin = l.plugin ? l.plugin + (l.plugin_version ? " " + l.plugin_version : "") : "–";
      const replay = el("button", "Replay");
      replay.type = "button";
      replay.addEventListener("click", () => replayLetter(l.sequence, replay));
      const action = el("td");
      action.append(replay);
      row.append(el("td", new Date(l.stored_at).toLocaleTimeString()), el("td", l.tenant + " / " + l.table),
        el("td", plugin), el("td", l.reason, "reason"), el("td", l.deliveries, "num"), action);
      body.append(row);
    }
  } catch (err) {
    message("Dead letters: " + err.message);
  }
}

async function replayLetter(sequence, button) {
  button.disabled = true;
  try {
    const response = await fetch("/v1/page/replay", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sequence }),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error);
    message("Dead letter " + sequence + " replayed.");
    loadLetters();
  } catch (err) {
    button.disabled = false;
    message("Replay of " + sequence + " failed: " + err.message);
  }
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = $("key");
  try {
    const response = await fetch("/v1/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ key: key.value }),
    });
    key.value = "";
    if (!response.ok) throw new Error((await response.json()).error);
    message("");
    setAdmin(true);
  } catch (err) {
    message("Login refused: " + err.message);
  }
});

$("logout").addEventListener("submit", async (event) => {
  event.preventDefault();
  await fetch("/v1/logout", { method: "POST" }).catch(() => {});
  setAdmin(false);
  $("tenants").hidden = true;
});

function setWall(on) {
  document.documentElement.classList.toggle("wall", on);
  try { localStorage.setItem("weir-wall", on ? "1" : ""); } catch (_) { /* private mode */ }
}
$("wall").addEventListener("click", () => setWall(!document.documentElement.classList.contains("wall")));
setWall(new URLSearchParams(location.search).has("wall") || (() => {
  try { return localStorage.getItem("weir-wall") === "1"; } catch (_) { return false; }
})());

poll();
