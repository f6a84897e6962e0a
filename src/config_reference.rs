//! The configuration reference (`docs/configuration.md`), rendered from the config types' JSON
//! schemas (`schemars`: doc comments, types, required keys and enum choices as the compiler sees
//! them) and the defaults the loader fills in, so it cannot drift from the code:
//! `ultr config-reference` writes it, and a test fails when the committed file differs.

use serde_json::{Map, Value};

use crate::config::PipelineConfig;

/// The schema of every named type (`$defs`), and the defaults of a config that names only its source.
struct Writer {
    defs: Map<String, Value>,
    defaults: toml::Value,
    out: String,
}

/// A property's schema without `Option`'s null: (the schema, whether the key may be left unset).
fn without_null(schema: &Value) -> (Value, bool) {
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let rest: Vec<&Value> = any.iter().filter(|s| s.get("type").and_then(Value::as_str) != Some("null")).collect();
        if rest.len() == 1 && rest.len() < any.len() {
            let mut inner = rest[0].clone();
            if let (Some(doc), Some(obj)) = (schema.get("description"), inner.as_object_mut()) {
                obj.insert("description".into(), doc.clone());
            }
            return (inner, true);
        }
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let rest: Vec<&Value> = types.iter().filter(|t| t.as_str() != Some("null")).collect();
        if rest.len() == 1 && rest.len() < types.len() {
            let mut inner = schema.clone();
            inner["type"] = rest[0].clone();
            return (inner, true);
        }
    }
    (schema.clone(), false)
}

/// Text of a doc comment as one Markdown table cell or paragraph.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

impl Writer {
    /// The named type a `$ref` points to, with its name.
    fn resolve<'a>(&'a self, schema: &'a Value) -> (Option<&'a str>, &'a Value) {
        match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
            Some(name) => (Some(name), &self.defs[name]),
            None => (None, schema),
        }
    }

    /// The property's own doc comment, else its type's.
    fn doc(&self, schema: &Value) -> String {
        let (_, target) = self.resolve(schema);
        schema.get("description").or_else(|| target.get("description")).and_then(Value::as_str).map(one_line).unwrap_or_default()
    }

    /// The variants of a choice (`oneOf`, or a plain `enum` of names).
    fn variants(schema: &Value) -> Vec<Value> {
        if let Some(one_of) = schema.get("oneOf").and_then(Value::as_array) {
            return one_of.clone();
        }
        schema.get("enum").and_then(Value::as_array).map(|names| names.iter().map(|n| serde_json::json!({ "const": n })).collect()).unwrap_or_default()
    }

    /// A variant that is a table of its own (`[source.kafka]`): its key and its schema.
    fn table_variant(variant: &Value) -> Option<(String, Value)> {
        let props = variant.get("properties")?.as_object()?;
        let (key, schema) = props.iter().next().filter(|_| props.len() == 1)?;
        Some((key.clone(), schema.clone()))
    }

    /// Where the value is a table: a struct, or a choice between tables.
    fn is_table(&self, schema: &Value) -> bool {
        let (_, target) = self.resolve(schema);
        target.get("properties").is_some() || Self::variants(target).iter().any(|v| Self::table_variant(v).is_some())
    }

    fn type_text(&self, schema: &Value, optional: bool) -> String {
        let (name, target) = self.resolve(schema);
        let t = match (name, target.get("type").and_then(Value::as_str), target.get("format").and_then(Value::as_str)) {
            (Some(name), ..) => format!("`{name}`"),
            (None, Some("string"), Some(format @ ("duration" | "size"))) => format.to_string(),
            (None, Some("object"), _) => "table".to_string(),
            (None, Some(t), _) => t.to_string(),
            (None, None, _) => "value".to_string(),
        };
        if optional {
            format!("{t} (optional)")
        } else {
            t
        }
    }

    /// A named choice's values and their docs, for the meaning column.
    fn choices(&self, schema: &Value) -> String {
        let (name, target) = self.resolve(schema);
        if name.is_none() {
            return String::new();
        }
        let names: Vec<String> = Self::variants(target)
            .iter()
            .filter_map(|v| {
                let value = v.get("const")?.as_str()?;
                Some(match v.get("description").and_then(Value::as_str) {
                    Some(doc) => format!("`\"{value}\"` ({})", one_line(doc).trim_end_matches('.')),
                    None => format!("`\"{value}\"`"),
                })
            })
            .collect();
        if names.is_empty() {
            String::new()
        } else {
            format!(" One of: {}.", names.join("; "))
        }
    }

    fn default_at(&self, path: &[String]) -> Option<&toml::Value> {
        let mut v = &self.defaults;
        for p in path {
            v = v.get(p)?;
        }
        Some(v)
    }

    /// One table: its keys, then its sub-tables.
    fn table(&mut self, path: &[String], schema: &Value, doc: &str) {
        let empty = Map::new();
        let props = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty).clone();
        let required: Vec<&str> = schema.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let (keys, tables): (Vec<_>, Vec<_>) = props.iter().map(|(k, s)| (k, without_null(s))).partition(|(_, (s, _))| !self.is_table(s));
        if !keys.is_empty() || !doc.is_empty() {
            let title = if path.is_empty() { "Top level".to_string() } else { format!("`[{}]`", path.join(".")) };
            self.out.push_str(&format!("\n## {title}\n\n"));
            if !doc.is_empty() {
                self.out.push_str(&format!("{doc}\n\n"));
            }
            if !keys.is_empty() {
                self.out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
                for (key, (s, optional)) in keys {
                    let mut p = path.to_vec();
                    p.push(key.clone());
                    let default = match self.default_at(&p) {
                        Some(v) => format!("`{v}`"),
                        None if optional || !required.contains(&key.as_str()) => "unset".to_string(),
                        None => "required".to_string(),
                    };
                    let meaning = format!("{}{}", self.doc(&s), self.choices(&s));
                    self.out.push_str(&format!("| `{key}` | {} | {} | {} |\n", self.type_text(&s, optional), cell(&default), cell(meaning.trim())));
                }
            }
        }
        for (key, (s, _)) in tables {
            let mut p = path.to_vec();
            p.push(key.clone());
            let doc = self.doc(&s);
            let target = self.resolve(&s).1.clone();
            if target.get("properties").is_some() {
                self.table(&p, &target, &doc);
            } else {
                self.choice(&p, &target, &doc);
            }
        }
    }

    /// A key whose value picks one of several tables (`source = "simulator"`, `[source.kafka]`).
    fn choice(&mut self, path: &[String], schema: &Value, doc: &str) {
        let name = path.join(".");
        self.out.push_str(&format!("\n## `{name}`\n\n"));
        if !doc.is_empty() {
            self.out.push_str(&format!("{doc}\n\n"));
        }
        self.out.push_str("One of:\n\n");
        let variants = Self::variants(schema);
        let mut tables = Vec::new();
        for v in &variants {
            let vdoc = v.get("description").and_then(Value::as_str).map(one_line).unwrap_or_default();
            let form = match (Self::table_variant(v), v.get("const").and_then(Value::as_str)) {
                (Some((key, inner)), _) => {
                    let form = format!("`[{name}.{key}]`");
                    tables.push((key, inner, vdoc.clone()));
                    form
                }
                (None, Some(value)) => format!("`{} = \"{value}\"`", path.last().map(String::as_str).unwrap_or("")),
                (None, None) => continue,
            };
            self.out.push_str(&format!("- {form}{}\n", if vdoc.is_empty() { String::new() } else { format!(": {vdoc}") }));
        }
        for (key, inner, vdoc) in tables {
            let mut p = path.to_vec();
            p.push(key);
            let doc = if vdoc.is_empty() { self.doc(&inner) } else { vdoc };
            let target = self.resolve(&inner).1.clone();
            self.table(&p, &target, &doc);
        }
    }
}

/// The reference as Markdown.
pub fn render() -> String {
    let schema = schemars::schema_for!(PipelineConfig).to_value();
    let config = PipelineConfig::parse("source = \"simulator\"\n", "(defaults)").expect("the defaults load");
    let defaults = toml::Value::try_from(&config).expect("a config serializes");
    let defs = schema.get("$defs").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut w = Writer { defs, defaults, out: String::new() };
    w.out.push_str(
        "# Configuration reference\n\n\
         Every key of a pipeline config (TOML), its type, its default and its meaning, table by table\n\
         and key by key in alphabetical order. Generated by `ultr config-reference > docs/configuration.md`\n\
         from the config types' schemas (their doc comments, types and choices, derived by `schemars`)\n\
         and the defaults the loader fills in; `tests/laboratory/config.rs` fails when this file is\n\
         stale. Unknown keys are refused, naming the key and the file. Durations are text (`500ms`,\n\
         `30s`, `10m`, `1h`, `28d`); sizes are text (`512MiB`, `2GiB`) or bytes. Types in backticks are\n\
         named values (`tower = \"embedding\"`), their choices listed in the meaning column.\n",
    );
    w.table(&[], &schema, "");
    w.out
}
