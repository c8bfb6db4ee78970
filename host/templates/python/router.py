import weir_plugin as weir


class Plugin(weir.Router):
    def init(self, settings):
        self.by_key_tables = set(settings.get("by_key", []))

    def route_table(self, topology, tenant, table):
        if table in self.by_key_tables:
            return weir.by_key()
        return weir.default_route()

    def route_key(self, topology, tenant, table, key):
        # Deterministic on every host: never Python's salted hash().
        return weir.to(sum(key.encode("utf-8")) % topology.partitions, 0)


WitWorld = weir.export(Plugin)
