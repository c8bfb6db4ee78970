import weir_plugin as weir


class Plugin(weir.Transform):
    def init(self, settings):
        self.field = settings.get("field", "checked")

    def row(self, row):
        # A row is a mapping of its JSON fields, read without parsing the
        # row whole; `row.json()` gives the whole object when you need it.
        if "id" not in row:
            return weir.dead_letter("missing id")
        if row.get("kind") == "noise":
            return weir.drop()
        row[self.field] = True
        return weir.emit(row)


WitWorld = weir.export(Plugin)
