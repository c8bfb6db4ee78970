// Runs a plugin's logic in Node on fixture rows, without weir or wasm:
//   node weir/test.mjs plugin.js rows.ndjson expected.ndjson [SETTINGS_JSON]
// The host import `weir:plugin/host` is served by weir/node-host.mjs.
import { register } from "node:module";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { resolve } from "node:path";

register("./node-host.mjs", import.meta.url);

const [pluginPath, rowsPath, expectedPath, settings] = process.argv.slice(2);
if (!expectedPath) {
  console.error("usage: node weir/test.mjs PLUGIN.js ROWS.ndjson EXPECTED.ndjson [SETTINGS_JSON]");
  process.exit(2);
}
const { Row, describe, packBatch, readOutcomes } = await import("./core.js");
const plugin = await import(pathToFileURL(resolve(pluginPath)).href);
const world = ["transform", "deliver"].find((name) => typeof plugin[name] === "function");
if (!world) {
  console.error(`${pluginPath}: only transforms and sinks have row fixtures`);
  process.exit(2);
}
plugin.init(settings ?? "{}");
const lines = readFileSync(rowsPath, "utf8").split("\n").filter((line) => line.trim());
const encoder = new TextEncoder();
const rows = lines.map((line, i) => new Row("t", "events", encoder.encode(line), [], BigInt(i + 1), 1, i));
// weir/state.js outside wasm keeps a map per tenant and table: it finds a
// row's scope by its index here.
globalThis.weirTestRows = rows;
const got = readOutcomes(plugin[world](packBatch(rows)), world === "deliver").map(describe);
const expected = readFileSync(expectedPath, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
// Compared as `weir plugin test --expect` compares: as JSON values, an
// emitted payload that is JSON as JSON (key order never matters).
function normalize(outcome) {
  const out = { ...outcome };
  if (out.outcome === "delivered") out.outcome = "ok";
  if (Array.isArray(out.rows)) {
    out.rows = out.rows.map((row) => {
      const r = { ...row };
      if (typeof r.payload === "string") {
        try { r.payload = JSON.parse(r.payload); } catch { /* text stays text */ }
      }
      if (Array.isArray(r.headers)) r.headers = Object.fromEntries(r.headers);
      if (r.headers && Object.keys(r.headers).length === 0) delete r.headers;
      return r;
    });
  }
  return out;
}
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
function differences(path, got, want) {
  const at = path || "the outcome";
  if (isObject(got) && isObject(want)) {
    const found = [];
    for (const [key, w] of Object.entries(want)) {
      const sub = path ? `${path}.${key}` : key;
      if (key in got) found.push(...differences(sub, got[key], w));
      else found.push(`${sub}: missing, expected ${JSON.stringify(w)}`);
    }
    for (const key of Object.keys(got)) {
      if (!(key in want)) found.push(`${path ? `${path}.${key}` : key}: got ${JSON.stringify(got[key])}, expected nothing`);
    }
    return found;
  }
  if (Array.isArray(got) && Array.isArray(want)) {
    const found = [];
    if (got.length !== want.length) found.push(`${at}: got ${got.length} items, expected ${want.length}`);
    for (let i = 0; i < Math.min(got.length, want.length); i++) found.push(...differences(`${path}[${i}]`, got[i], want[i]));
    return found;
  }
  return JSON.stringify(got) === JSON.stringify(want) ? [] : [`${at}: got ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`];
}
const problems = [];
if (got.length !== expected.length) {
  problems.push(`${got.length} rows but ${expected.length} expected outcomes: one is expected per row`);
}
got.forEach((outcome, i) => {
  if (i < expected.length) {
    for (const found of differences("", normalize(outcome), normalize(expected[i]))) problems.push(`line ${i + 1}: ${found}`);
  }
});
problems.forEach((problem) => console.log(problem));
const failed = problems.length > 0;
console.log(`${pluginPath}: ${failed ? "FAILED" : "every row as expected"}`);
process.exit(failed ? 1 : 0);
