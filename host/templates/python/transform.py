import weir_plugin as weir


class Plugin(weir.Transform):
    def init(self, settings):
        self.field = settings.get("field", "checked")

    def row(self, row):
        data = row.json()
        if "id" not in data:
            return weir.dead_letter("missing id")
        if data.get("kind") == "noise":
            return weir.drop()
        data[self.field] = True
        return weir.emit(data)


WitWorld = weir.export(Plugin)
