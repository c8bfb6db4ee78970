import * as weir from "./weir/index.js";

export const { init, deliver } = weir.sink({
  init(settings) {
    this.prefix = settings.prefix ?? "delivered";
  },
  row(row) {
    const data = row.json();
    if (!("id" in data)) return weir.deadLetter("missing id");
    // A real sink writes the row somewhere (a granted dir, an HTTP API).
    weir.log.info(`${this.prefix} ${row.tenant}/${row.table} id=${data.id}`);
    weir.count("rows_delivered");
    return weir.ok();
  },
});
