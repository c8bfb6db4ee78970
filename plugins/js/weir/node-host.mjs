// A Node loader hook (registered by test.mjs) serving the WIT imports
// outside wasm: `weir:plugin/host@0.3.0` (log lines and counters go to
// stderr), `weir:plugin/state@0.3.0` (a map per tenant and table, for the
// rows test.mjs runs) and `weir:plugin/http-batch@0.3.0`:
// `globalThis.weirHttpResponder` (request => { tag: "ok", val: { status,
// headers, body } } or { tag: "err", val: { tag: "timeout" } }) answers, or
// every request is refused.
const FAKES = {
  "weir:plugin/host": "weir-host:fake",
  "weir:plugin/state": "weir-state:fake",
  "weir:plugin/http-batch": "weir-http:fake",
};

export async function resolve(specifier, context, next) {
  for (const [prefix, url] of Object.entries(FAKES)) {
    if (specifier.startsWith(prefix)) return { url, shortCircuit: true };
  }
  return next(specifier, context);
}

const HOST = `export function log(level, message) { console.error(level + ": " + message); }
export function addCounter(name, delta) { console.error("counter " + name + " += " + delta); }`;

// Keys are compared as text: fixture keys are UTF-8.
const STATE = `const scopes = new Map();
const utf8 = new TextDecoder();
function scope(index) {
  const row = (globalThis.weirTestRows || [])[index];
  const name = row ? row.tenant + "/" + row.table : "";
  if (!scopes.has(name)) scopes.set(name, new Map());
  return scopes.get(name);
}
export function get(index, key) { return scope(index).get(utf8.decode(key)); }
export function set(index, key, value) { scope(index).set(utf8.decode(key), value.slice()); }
function remove(index, key) { scope(index).delete(utf8.decode(key)); }
export { remove as delete };
export function list(index, prefix) {
  const p = utf8.decode(prefix), encoder = new TextEncoder();
  return [...scope(index)].filter(([k]) => k.startsWith(p)).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([k, v]) => [encoder.encode(k), v]);
}`;

const HTTP = `export function fetchAll(requests, options) {
  const refused = { tag: "err", val: { tag: "refused", val: "no host outside wasm: set globalThis.weirHttpResponder" } };
  return requests.map((r) => globalThis.weirHttpResponder ? globalThis.weirHttpResponder(r, options) : refused);
}`;

const SOURCES = { "weir-host:fake": HOST, "weir-state:fake": STATE, "weir-http:fake": HTTP };

export async function load(url, context, next) {
  if (url in SOURCES) return { format: "module", shortCircuit: true, source: SOURCES[url] };
  return next(url, context);
}
