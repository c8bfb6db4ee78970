use serde_json::{Map, Value};
use weir_plugin::{Deliveries, Rows, Sink};

struct Plugin {
    prefix: String,
}

impl Sink for Plugin {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Map<String, Value> = weir_plugin::settings(&settings)?;
        let prefix = settings.get("prefix").and_then(Value::as_str);
        Ok(Plugin {
            prefix: prefix.unwrap_or("delivered").to_string(),
        })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        for row in rows.iter() {
            let data =
                serde_json::from_slice::<Map<String, Value>>(row.payload).unwrap_or_default();
            let Some(id) = data.get("id") else {
                out.dead_letter("missing id");
                continue;
            };
            // A real sink writes the row somewhere (a granted dir, an HTTP API).
            weir_plugin::log::info(&format!(
                "{} {}/{} id={id}",
                self.prefix, row.tenant, row.table
            ));
            weir_plugin::counter("rows_delivered", 1);
            out.ok();
        }
    }
}

weir_plugin::export_sink!(Plugin);
