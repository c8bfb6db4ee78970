//! Names in SQL: identifiers quoted, and the target table of a row from the
//! `table` template.

/// Longest identifier PostgreSQL keeps (NAMEDATALEN - 1 bytes). It cuts
/// longer ones silently, which could make two tenants' tables one.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// `identifier` as a quoted SQL identifier (`"` doubled), taken exactly as
/// written: case is kept. Refused if empty, longer than PostgreSQL keeps,
/// or holding a NUL.
pub fn quote(identifier: &str) -> Result<String, String> {
    if identifier.is_empty() {
        return Err("an empty name".to_string());
    }
    if identifier.len() > MAX_IDENTIFIER_BYTES {
        return Err(format!(
            "the name {identifier:?} is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes"
        ));
    }
    if identifier.contains('\0') {
        return Err(format!("the name {identifier:?} holds a NUL"));
    }
    Ok(format!("\"{}\"", identifier.replace('"', "\"\"")))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Tenant,
    Table,
}

/// The `table` setting: a table name or `schema.table`, each part literal
/// text and the placeholders `{tenant}` and `{table}`, e.g.
/// `"{tenant}.{table}"` or `"{tenant}_{table}"`. The parts are split at the
/// template's dots, before the row's names go in, so a dot in a tenant's
/// name stays inside its part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Vec<Piece>>,
}

impl Template {
    pub fn parse(template: &str) -> Result<Template, String> {
        let mut parts = vec![Vec::new()];
        let mut literal = String::new();
        let mut chars = template.chars();
        while let Some(c) = chars.next() {
            match c {
                '{' => {
                    let rest = chars.as_str();
                    let Some(end) = rest.find('}') else {
                        return Err("a `{` opens a placeholder no `}` closes".to_string());
                    };
                    let name = &rest[..end];
                    chars = rest[end + 1..].chars();
                    let piece = match name {
                        "tenant" => Piece::Tenant,
                        "table" => Piece::Table,
                        _ => {
                            return Err(format!(
                                "unknown placeholder {{{name}}}: only {{tenant}} and {{table}} \
                                 (a `{{` always opens one)"
                            ));
                        }
                    };
                    flush(&mut parts, &mut literal);
                    push(&mut parts, piece);
                }
                '}' => return Err("a `}` closes no placeholder".to_string()),
                '.' => {
                    flush(&mut parts, &mut literal);
                    parts.push(Vec::new());
                }
                c => literal.push(c),
            }
        }
        flush(&mut parts, &mut literal);
        if parts.len() > 2 {
            return Err("at most two parts, `schema.table`".to_string());
        }
        for part in &parts {
            match part.as_slice() {
                [] => return Err("an empty part (a leading, trailing or doubled `.`)".to_string()),
                // A part without placeholders is checked now, not per row.
                [Piece::Literal(name)] => {
                    quote(name)?;
                }
                _ => {}
            }
        }
        Ok(Template { parts })
    }

    /// The quoted, possibly schema-qualified name of a row's table.
    pub fn render(&self, tenant: &str, table: &str) -> Result<String, String> {
        let mut quoted = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            let mut name = String::new();
            for piece in part {
                match piece {
                    Piece::Literal(text) => name.push_str(text),
                    Piece::Tenant => name.push_str(tenant),
                    Piece::Table => name.push_str(table),
                }
            }
            quoted.push(quote(&name)?);
        }
        Ok(quoted.join("."))
    }
}

fn flush(parts: &mut [Vec<Piece>], literal: &mut String) {
    if !literal.is_empty() {
        push(parts, Piece::Literal(std::mem::take(literal)));
    }
}

fn push(parts: &mut [Vec<Piece>], piece: Piece) {
    if let Some(part) = parts.last_mut() {
        part.push(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_identifiers_as_written() {
        assert_eq!(quote("orders").unwrap(), "\"orders\"");
        assert_eq!(quote("Acme Orders").unwrap(), "\"Acme Orders\"");
        assert_eq!(quote("a\"b").unwrap(), "\"a\"\"b\"");
        assert_eq!(quote("é").unwrap(), "\"é\"");
        assert!(quote("").is_err());
        assert!(quote("a\0b").is_err());
        assert!(quote(&"x".repeat(63)).is_ok());
        let e = quote(&"x".repeat(64)).unwrap_err();
        assert!(e.contains("63 bytes"), "{e}");
        // Bytes, not characters, are what PostgreSQL counts.
        assert!(quote(&"é".repeat(32)).is_err());
    }

    #[test]
    fn renders_a_row_table() {
        let render = |template: &str, tenant: &str, table: &str| {
            Template::parse(template).unwrap().render(tenant, table)
        };
        assert_eq!(
            render("{tenant}_{table}", "acme", "orders").unwrap(),
            "\"acme_orders\""
        );
        assert_eq!(render("events", "acme", "orders").unwrap(), "\"events\"");
        assert_eq!(
            render("{tenant}.{table}", "acme", "orders").unwrap(),
            "\"acme\".\"orders\""
        );
        assert_eq!(
            render("raw.t_{table}_v1", "acme", "or\"ders").unwrap(),
            "\"raw\".\"t_or\"\"ders_v1\""
        );
        // A dot a row brings is part of a name, not a separator.
        assert_eq!(
            render("{tenant}.{table}", "a.b", "c").unwrap(),
            "\"a.b\".\"c\""
        );
        assert!(render("{tenant}.{table}", "", "orders").is_err());
        assert!(render("{table}", &"t".repeat(64), "x").is_ok());
        assert!(render("{tenant}", &"t".repeat(64), "x").is_err());
    }

    #[test]
    fn refuses_bad_templates() {
        for bad in [
            "",
            ".orders",
            "orders.",
            "a..b",
            "a.b.c",
            "{tenants}",
            "{tenant",
            "orders}",
            "{}",
            "x{TABLE}",
            "a\0",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad:?}");
        }
        let e = Template::parse(&"x".repeat(64)).unwrap_err();
        assert!(e.contains("63 bytes"), "{e}");
    }
}
