import * as weir from "./weir/index.js";

export const { init, transform } = weir.transform({
  init(settings) {
    this.field = settings.field ?? "checked";
  },
  row(row) {
    const data = row.json();
    if (!("id" in data)) return weir.deadLetter("missing id");
    if (data.kind === "noise") return weir.drop();
    data[this.field] = true;
    return weir.emit(data);
  },
});
