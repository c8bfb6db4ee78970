import weir_plugin as weir


class Plugin(weir.Sink):
    def init(self, settings):
        self.prefix = settings.get("prefix", "delivered")

    def row(self, row):
        data = row.json()
        if "id" not in data:
            return weir.dead_letter("missing id")
        # A real sink writes the row somewhere (a granted dir, an HTTP API).
        weir.log.info("%s %s/%s id=%s" % (self.prefix, row.tenant, row.table, data["id"]))
        weir.count("rows_delivered")
        return weir.ok()


WitWorld = weir.export(Plugin)
