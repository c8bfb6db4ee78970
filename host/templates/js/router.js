import * as weir from "./weir/index.js";

export const { init, routeTable, routeKeys } = weir.router({
  init(settings) {
    this.byKeyTables = new Set(settings.by_key ?? []);
  },
  routeTable(topology, tenant, table) {
    return this.byKeyTables.has(table) ? weir.byKey() : weir.defaultRoute();
  },
  routeKey(topology, tenant, table, key) {
    // Deterministic on every host: the sum of the key's UTF-8 bytes.
    const sum = new TextEncoder().encode(key).reduce((a, b) => a + b, 0);
    return weir.to(sum % topology.partitions, 0);
  },
});
