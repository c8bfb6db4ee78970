import * as weir from "./weir/index.js";

export const { init, transform } = weir.transform({
  init(settings) {
    this.field = settings.field ?? "checked";
  },
  row(row) {
    // A row's JSON fields are read without parsing the row whole;
    // `row.json()` gives the whole object when you need it.
    if (!row.has("id")) return weir.deadLetter("missing id");
    if (row.get("kind") === "noise") return weir.drop();
    row.set(this.field, true);
    return weir.emit(row);
  },
});
