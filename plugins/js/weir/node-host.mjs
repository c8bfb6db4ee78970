// A Node loader hook (registered by test.mjs) serving the WIT imports
// `weir:plugin/host@0.2.0` outside wasm: log lines and counters go to
// stderr; and `weir:plugin/http-batch@0.2.0`: `globalThis.weirHttpResponder`
// (request => { tag: "ok", val: { status, headers, body } } or
// { tag: "err", val: { tag: "timeout" } }) answers, or every request is refused.
export async function resolve(specifier, context, next) {
  if (specifier.startsWith("weir:plugin/host")) return { url: "weir-host:fake", shortCircuit: true };
  if (specifier.startsWith("weir:plugin/http-batch")) return { url: "weir-http:fake", shortCircuit: true };
  return next(specifier, context);
}

export async function load(url, context, next) {
  if (url === "weir-host:fake") {
    return {
      format: "module",
      shortCircuit: true,
      source: `export function log(level, message) { console.error(level + ": " + message); }
               export function addCounter(name, delta) { console.error("counter " + name + " += " + delta); }`,
    };
  }
  if (url === "weir-http:fake") {
    return {
      format: "module",
      shortCircuit: true,
      source: `export function fetchAll(requests, options) {
                 const refused = { tag: "err", val: { tag: "refused", val: "no host outside wasm: set globalThis.weirHttpResponder" } };
                 return requests.map((r) => globalThis.weirHttpResponder ? globalThis.weirHttpResponder(r, options) : refused);
               }`,
    };
  }
  return next(url, context);
}
