import weir_plugin as weir


class Plugin(weir.Budget):
    def init(self, settings):
        self.max_queued_rows = settings.get("max_queued_rows", 100000)

    def admit(self, request):
        # The tenant's own settings (`weir tenant set`) win over the plugin's.
        tenant = request.settings or {}
        if tenant.get("blocked"):
            return weir.reject("tenant %s is blocked" % request.tenant)
        limit = tenant.get("max_queued_rows", self.max_queued_rows)
        if request.usage.queued_rows + request.rows > limit:
            return weir.throttle(1000)
        return weir.admit()


WitWorld = weir.export(Plugin)
