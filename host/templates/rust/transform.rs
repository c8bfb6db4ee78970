use serde_json::{Map, Value};
use weir_plugin::{Outcomes, Rows, Transform};

struct Plugin {
    field: String,
}

impl Transform for Plugin {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Map<String, Value> = weir_plugin::settings(&settings)?;
        let field = settings.get("field").and_then(Value::as_str);
        Ok(Plugin {
            field: field.unwrap_or("checked").to_string(),
        })
    }

    fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
        for row in rows.iter() {
            let Ok(mut data) = serde_json::from_slice::<Map<String, Value>>(row.payload) else {
                out.dead_letter("not a JSON object");
                continue;
            };
            if !data.contains_key("id") {
                out.dead_letter("missing id");
            } else if data.get("kind").and_then(Value::as_str) == Some("noise") {
                out.discard();
            } else {
                data.insert(self.field.clone(), Value::Bool(true));
                out.replace_with(&row, |buf| serde_json::to_writer(buf, &data).unwrap_or(()));
            }
        }
    }
}

weir_plugin::export_transform!(Plugin);
