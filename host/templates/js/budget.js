import * as weir from "./weir/index.js";

export const { init, admit } = weir.budget({
  init(settings) {
    this.maxQueuedRows = settings.max_queued_rows ?? 100000;
  },
  admit(request) {
    // The tenant's own settings (`weir tenant set`) win over the plugin's.
    const tenant = request.settings ?? {};
    if (tenant.blocked) return weir.reject(`tenant ${request.tenant} is blocked`);
    const limit = tenant.max_queued_rows ?? this.maxQueuedRows;
    if (Number(request.usage.queuedRows) + request.rows > limit) return weir.throttle(1000);
    return weir.admit();
  },
});
