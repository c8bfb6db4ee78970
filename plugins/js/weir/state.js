// Durable state for a transform or sink (`grants.state` in the TOML): this
// plugin's keys for a row's tenant and table, kept across batches, crashes
// and handovers, stored with the batch's acks (plugins/README.md, "Durable
// state"). A module of its own, imported only by plugins that use it:
// budgets and routers have no state, and componentize-js refuses an import
// their world lacks.
//
//   import * as state from "./weir/state.js";
//   const seen = Number(state.getText(row, "count") ?? "0") + 1;
//   state.set(row, "count", String(seen));  // a StateError dead-letters the row
import * as host from "weir:plugin/state@0.3.0";

const encoder = new TextEncoder();
const utf8 = new TextDecoder();

/** A call the host refused: a write past a `grants.state` limit. Thrown
 * from `row`, it dead-letters the row with the host's reason. */
export class StateError extends Error {
  constructor(message) {
    super(message);
    this.name = "StateError";
  }
}

const bytes = (value) => (value instanceof Uint8Array ? value : encoder.encode(String(value)));

function call(method, ...args) {
  try {
    return method(...args);
  } catch (error) {
    // componentize-js throws a result's `err` with the value as `payload`.
    const reason = error && error.payload !== undefined ? error.payload : error && error.message;
    throw new StateError(String(reason ?? error));
  }
}

/** The value of `key` (a string is UTF-8) as bytes, or undefined. */
export function get(row, key) {
  const value = call(host.get, row.index, bytes(key));
  return value === undefined || value === null ? undefined : value;
}

/** The value of `key` as UTF-8 text, or undefined. */
export function getText(row, key) {
  const value = get(row, key);
  return value === undefined ? undefined : utf8.decode(value);
}

/** Sets `key` to `value` (bytes, or a string as UTF-8); throws a
 * StateError past the grant's limits. */
export function set(row, key, value) {
  call(host.set, row.index, bytes(key), bytes(value));
}

function remove(row, key) {
  call(host.delete, row.index, bytes(key));
}
export { remove as delete };

/** Every [key, value] (bytes) whose key starts with `prefix`, in key order. */
export function list(row, prefix = "") {
  return call(host.list, row.index, bytes(prefix));
}
