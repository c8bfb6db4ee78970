// A Node loader hook (registered by test.mjs) serving the WIT import
// `weir:plugin/host@0.2.0` outside wasm: log lines and counters go to stderr.
export async function resolve(specifier, context, next) {
  if (specifier.startsWith("weir:plugin/host")) return { url: "weir-host:fake", shortCircuit: true };
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
  return next(url, context);
}
