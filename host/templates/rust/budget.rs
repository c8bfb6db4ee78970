use serde_json::{Map, Value};
use weir_plugin::Budget;
use weir_plugin::budget::{Admission, Decision};

struct Plugin {
    max_queued_rows: u64,
}

impl Budget for Plugin {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Map<String, Value> = weir_plugin::settings(&settings)?;
        let max = settings.get("max_queued_rows").and_then(Value::as_u64);
        Ok(Plugin {
            max_queued_rows: max.unwrap_or(100_000),
        })
    }

    fn admit(&mut self, request: &Admission) -> Decision {
        // The tenant's own settings (`weir tenant set`) win over the plugin's.
        let tenant: Map<String, Value> = request
            .tenant_settings
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        if tenant.get("blocked").and_then(Value::as_bool) == Some(true) {
            return Decision::Reject(format!("tenant {} is blocked", request.tenant));
        }
        let limit = tenant.get("max_queued_rows").and_then(Value::as_u64);
        if request.usage.queued_rows + u64::from(request.rows)
            > limit.unwrap_or(self.max_queued_rows)
        {
            return Decision::Throttle(1000);
        }
        Decision::Admit
    }
}

weir_plugin::export_budget!(Plugin);
