// weir plugins in JavaScript, built with componentize-js. A plugin module:
//
//   import * as weir from "./weir/index.js";
//   export const { init, transform } = weir.transform({ init(settings) {…}, row(row) {…} });
//
// (sink: `{ init, deliver } = weir.sink(…)`, budget: `{ init, admit }`,
// router: `{ init, routeTable, routeKeys }`). See plugins/README.md.
import { log as hostLog, addCounter } from "weir:plugin/host@0.3.0";
import {
  guarded, initPlugin, packDelivered, packTransformed, parseSettings, runBatch, unpack,
} from "./core.js";

export {
  Row, out, ok, emit, drop, retry, deadLetter, admit, throttle, reject, defaultRoute, to, byKey,
} from "./core.js";

/** Structured log lines, attributed to the plugin by the host. */
export const log = {
  trace: (message) => hostLog("trace", String(message)),
  debug: (message) => hostLog("debug", String(message)),
  info: (message) => hostLog("info", String(message)),
  warn: (message) => hostLog("warn", String(message)),
  error: (message) => hostLog("error", String(message)),
};

/** Adds `delta` to the plugin's counter `name` (a metric of the host). */
export function count(name, delta = 1) {
  addCounter(name, BigInt(delta));
}

const init = (plugin) => (settings) => initPlugin(plugin, settings);

/** A pipeline step: `row(row)` returns each row's outcome (or `batch(rows)`
 * returns them all). An error thrown in `row` dead-letters that row. */
export function transform(plugin) {
  return {
    init: init(plugin),
    transform: (batch) => guarded(() => {
      const rows = unpack(batch);
      return packTransformed(rows, runBatch(plugin, rows));
    }),
  };
}

/** The last step: `row(row)` returns ok() once delivered, retry(ms) or
 * deadLetter(reason) (or `batch(rows)` returns them all). */
export function sink(plugin) {
  return {
    init: init(plugin),
    deliver: (batch) => guarded(() => {
      const rows = unpack(batch);
      return packDelivered(rows, runBatch(plugin, rows));
    }),
  };
}

/** A budget: `admit(request)` returns admit(), throttle(ms) or reject(reason);
 * `request.settings` is the tenant's settings parsed (or undefined). */
export function budget(plugin) {
  return {
    init: init(plugin),
    admit: (request) => guarded(() => {
      const settings = request.tenantSettings;
      request.settings = settings === undefined ? undefined : parseSettings(settings);
      return plugin.admit(request) ?? { tag: "admit" };
    }),
  };
}

/** A router: `routeTable(topology, tenant, table)` returns a route or
 * byKey(); `routeKey(topology, tenant, table, key)` routes one row's key. */
export function router(plugin) {
  return {
    init: init(plugin),
    routeTable: (topology, tenant, table) => guarded(() => {
      const route = plugin.routeTable ? plugin.routeTable(topology, tenant, table) : undefined;
      if (route && route.tag === "by-key") return route;
      return { tag: "fixed", val: route ?? { tag: "default-route" } };
    }),
    routeKeys: (topology, tenant, table, keys) => guarded(() =>
      keys.map((key) =>
        (key !== undefined && plugin.routeKey ? plugin.routeKey(topology, tenant, table, key) : undefined)
          ?? { tag: "default-route" })),
  };
}
