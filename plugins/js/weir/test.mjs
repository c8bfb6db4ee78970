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
const rows = lines.map((line, i) => new Row("t", "events", encoder.encode(line), [], BigInt(i + 1), 1));
const got = readOutcomes(plugin[world](packBatch(rows)), world === "deliver").map(describe);
const expected = readFileSync(expectedPath, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
let failed = got.length !== expected.length;
if (failed) console.log(`${got.length} outcomes, expected ${expected.length}`);
got.forEach((outcome, i) => {
  if (JSON.stringify(outcome) !== JSON.stringify(expected[i])) {
    failed = true;
    console.log(`row ${i + 1}: got ${JSON.stringify(outcome)}, expected ${JSON.stringify(expected[i])}`);
  }
});
console.log(`${pluginPath}: ${failed ? "FAILED" : "every row as expected"}`);
process.exit(failed ? 1 : 0);
