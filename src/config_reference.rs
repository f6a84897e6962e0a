//! The configuration reference (`docs/configuration.md`), generated from the config structs' doc
//! comments and the defaults the loader fills in, so it cannot drift from the code:
//! `ultr config-reference` writes it, and a test fails when the committed file differs.

use std::collections::BTreeMap;

use crate::config::PipelineConfig;

/// The files that hold the config structs, read when `ultr` is compiled.
const SOURCES: &[&str] = &[
    include_str!("config.rs"),
    include_str!("../crates/core/src/session/decode.rs"),
    include_str!("../crates/core/src/sources/kafka.rs"),
    include_str!("../crates/core/src/sinks/config.rs"),
    include_str!("../crates/core/src/window/config.rs"),
    include_str!("../crates/core/src/state/config.rs"),
    include_str!("../crates/core/src/state/remote.rs"),
    include_str!("../crates/core/src/identify/config.rs"),
    include_str!("../crates/lab/src/simulate/mod.rs"),
    include_str!("../crates/lab/src/simulate/click.rs"),
    include_str!("../crates/train/src/config.rs"),
    include_str!("../crates/train/src/uncertainty.rs"),
    include_str!("../crates/train/src/models/observation_tower.rs"),
    include_str!("../crates/train/src/models/gradient_reversal.rs"),
    include_str!("../crates/train/src/models/observation_dropout.rs"),
    include_str!("../crates/train/src/models/dla.rs"),
    include_str!("../crates/train/src/models/edot.rs"),
    include_str!("../crates/train/src/models/mixem.rs"),
    include_str!("../crates/train/src/models/xpa.rs"),
    include_str!("../crates/train/src/eval/config.rs"),
    include_str!("service/config.rs"),
    include_str!("../crates/core/src/runtime.rs"),
];

#[derive(Debug, Clone)]
struct Field {
    name: String,
    ty: String,
    doc: String,
    /// `#[serde(default …)]` on the field: it may be left out.
    has_default: bool,
}

/// An enum variant: its name, its fields (a struct variant) or the one type it wraps, and its doc.
type Variant = (String, Option<Vec<Field>>, Option<String>, String);

#[derive(Debug, Clone)]
enum Shape {
    Struct(Vec<Field>),
    /// Variants: name, their fields (a struct variant), or the one type they wrap.
    Enum(Vec<Variant>),
}

#[derive(Debug, Clone)]
struct Item {
    doc: String,
    shape: Shape,
}

fn join_doc(lines: &[String]) -> String {
    lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// A field declaration `[pub] name: Type,` (config fields fit on one line).
fn field_of(line: &str) -> Option<(String, String)> {
    let line = line.trim().trim_start_matches("pub ");
    let (name, ty) = line.split_once(": ")?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return None;
    }
    let ty = ty.split(" //").next().unwrap_or(ty).trim().trim_end_matches(',').trim();
    Some((name.to_string(), ty.to_string()))
}

/// Splits `a: A, b: B<C, D>` at the commas outside angle brackets.
fn split_top(text: &str) -> Vec<String> {
    let (mut parts, mut depth, mut current) = (Vec::new(), 0i32, String::new());
    for c in text.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current).trim().to_string());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        parts.push(current.trim().to_string());
    }
    parts
}

/// A serde attribute that keeps the field out of the file format (retired keys, runtime state).
fn skipped(attrs: &[String]) -> bool {
    attrs
        .iter()
        .any(|a| a.contains("serde(") && (a.contains("skip)") || a.contains("skip,") || a.contains("skip_serializing)") || a.contains("skip_deserializing")))
}

/// The fields of a struct body or a struct variant, up to its closing `}` (or `},`), with their doc
/// comments; fields serde keeps out of the file format are left out.
fn body_fields<'a>(lines: &mut impl Iterator<Item = &'a str>) -> Vec<Field> {
    let mut fields = Vec::new();
    let (mut doc, mut attrs): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for l in lines {
        let t = l.trim();
        if t == "}" || t == "}," {
            break;
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.to_string());
        } else if t.starts_with("#[") {
            attrs.push(t.to_string());
        } else if let Some((name, ty)) = field_of(t) {
            if !skipped(&attrs) {
                fields.push(Field { name, ty, doc: join_doc(&doc), has_default: attrs.iter().any(|a| a.contains("serde(default")) });
            }
            doc.clear();
            attrs.clear();
        }
    }
    fields
}

/// Every `pub struct` and `pub enum` of the sources with its doc comment and fields.
fn items() -> BTreeMap<String, Item> {
    let mut out = BTreeMap::new();
    for source in SOURCES {
        let mut doc: Vec<String> = Vec::new();
        let mut attrs: Vec<String> = Vec::new();
        let mut lines = source.lines().peekable();
        while let Some(line) = lines.next() {
            let t = line.trim();
            if let Some(d) = t.strip_prefix("///") {
                doc.push(d.to_string());
                continue;
            }
            if t.starts_with("#[") {
                attrs.push(t.to_string());
                continue;
            }
            let header = |kw: &str| {
                t.strip_prefix(kw).and_then(|r| r.strip_suffix(" {")).filter(|n| n.chars().all(|c| c.is_alphanumeric() || c == '_')).map(str::to_string)
            };
            if let Some(name) = header("pub struct ") {
                let item_doc = join_doc(&doc);
                let fields = body_fields(&mut lines);
                out.entry(name).or_insert(Item { doc: item_doc, shape: Shape::Struct(fields) });
            } else if let Some(name) = header("pub enum ") {
                let item_doc = join_doc(&doc);
                let mut variants = Vec::new();
                let mut vdoc: Vec<String> = Vec::new();
                while let Some(l) = lines.next() {
                    let t = l.trim();
                    if t == "}" {
                        break;
                    }
                    if let Some(d) = t.strip_prefix("///") {
                        vdoc.push(d.to_string());
                    } else if t.starts_with("#[") || t.is_empty() {
                        continue;
                    } else if let Some((v, inner)) = t.trim_end_matches(',').strip_suffix('}').and_then(|r| r.split_once(" { ")) {
                        // A struct variant on one line: `File { paths: Vec<PathBuf> },`.
                        let fields = split_top(inner)
                            .iter()
                            .filter_map(|f| field_of(f))
                            .map(|(name, ty)| Field { name, ty, doc: String::new(), has_default: false })
                            .collect();
                        variants.push((v.to_string(), Some(fields), None, join_doc(&vdoc)));
                        vdoc.clear();
                    } else if let Some(v) = t.strip_suffix(" {") {
                        let fields = body_fields(&mut lines);
                        variants.push((v.to_string(), Some(fields), None, join_doc(&vdoc)));
                        vdoc.clear();
                    } else if let Some((v, inner)) = t.trim_end_matches(',').split_once('(') {
                        variants.push((v.to_string(), None, Some(inner.trim_end_matches(')').to_string()), join_doc(&vdoc)));
                        vdoc.clear();
                    } else {
                        variants.push((t.trim_end_matches(',').to_string(), None, None, join_doc(&vdoc)));
                        vdoc.clear();
                    }
                }
                out.entry(name).or_insert(Item { doc: item_doc, shape: Shape::Enum(variants) });
            }
            doc.clear();
            attrs.clear();
        }
    }
    out
}

/// `Option<crate::a::B>` → (`B`, optional).
fn base_type(ty: &str) -> (String, bool) {
    let (inner, optional) = match ty.strip_prefix("Option<").and_then(|r| r.strip_suffix('>')) {
        Some(inner) => (inner, true),
        None => (ty, false),
    };
    // The outer type's last path segment, generics kept: `std::collections::BTreeMap<String, T>` → `BTreeMap<String, T>`.
    let short = match inner.find('<') {
        Some(i) => format!("{}{}", inner[..i].rsplit("::").next().unwrap_or(""), &inner[i..]),
        None => inner.rsplit("::").next().unwrap_or(inner).to_string(),
    };
    (short, optional)
}

fn snake(name: &str) -> String {
    let mut s = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                s.push('_');
            }
            s.extend(c.to_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

fn type_text(ty: &str) -> String {
    let (base, optional) = base_type(ty);
    let t = match base.as_str() {
        "String" => "string".to_string(),
        "usize" | "u64" | "u32" | "i64" | "i32" => "integer".to_string(),
        "f64" | "f32" => "number".to_string(),
        "bool" => "boolean".to_string(),
        "PathBuf" => "path".to_string(),
        "ConfigDuration" => "duration".to_string(),
        "ConfigBytes" => "size".to_string(),
        _ if base.starts_with("Vec<") => "array".to_string(),
        _ if base.starts_with("BTreeMap<") || base.starts_with("HashMap<") => "table".to_string(),
        other => format!("`{other}`"),
    };
    if optional {
        format!("{t} (optional)")
    } else {
        t
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

struct Writer<'a> {
    items: &'a BTreeMap<String, Item>,
    defaults: toml::Value,
    out: String,
}

impl Writer<'_> {
    fn default_at(&self, path: &[String]) -> Option<&toml::Value> {
        let mut v = &self.defaults;
        for p in path {
            v = v.get(p)?;
        }
        Some(v)
    }

    /// One table: its keys, then its sub-tables.
    fn table(&mut self, path: &[String], fields: &[Field], doc: &str) {
        let (keys, tables): (Vec<&Field>, Vec<&Field>) = fields.iter().partition(|f| !self.is_table(&f.ty));
        if !keys.is_empty() || !doc.is_empty() {
            let title = if path.is_empty() { "Top level".to_string() } else { format!("`[{}]`", path.join(".")) };
            self.out.push_str(&format!("\n## {title}\n\n"));
            if !doc.is_empty() {
                self.out.push_str(&format!("{doc}\n\n"));
            }
            if !keys.is_empty() {
                self.out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
                for f in keys {
                    let mut p = path.to_vec();
                    p.push(f.name.clone());
                    let default = match self.default_at(&p) {
                        Some(v) => format!("`{v}`"),
                        None if base_type(&f.ty).1 || f.has_default => "unset".to_string(),
                        None => "required".to_string(),
                    };
                    self.out.push_str(&format!("| `{}` | {} | {} | {} |\n", f.name, type_text(&f.ty), cell(&default), cell(&f.doc)));
                }
            }
        }
        for f in tables {
            let mut p = path.to_vec();
            p.push(f.name.clone());
            let item = self.items[&base_type(&f.ty).0].clone();
            let doc = if f.doc.is_empty() { item.doc.clone() } else { f.doc.clone() };
            match &item.shape {
                Shape::Struct(fields) => self.table(&p, fields, &doc),
                Shape::Enum(variants) => self.choice(&p, variants, &doc),
            }
        }
    }

    /// A key whose value picks one of several tables (`source = "simulator"`, `[source.kafka]`).
    fn choice(&mut self, path: &[String], variants: &[Variant], doc: &str) {
        let name = path.join(".");
        self.out.push_str(&format!("\n## `{name}`\n\n"));
        if !doc.is_empty() {
            self.out.push_str(&format!("{doc}\n\n"));
        }
        self.out.push_str("One of:\n\n");
        for (v, fields, wrapped, vdoc) in variants {
            let key = snake(v);
            let form = if fields.is_some() || wrapped.is_some() {
                format!("`[{name}.{key}]`")
            } else {
                format!("`{} = \"{key}\"`", path.last().map(String::as_str).unwrap_or(""))
            };
            self.out.push_str(&format!("- {form}{}\n", if vdoc.is_empty() { String::new() } else { format!(": {vdoc}") }));
        }
        for (v, fields, wrapped, vdoc) in variants {
            let mut p = path.to_vec();
            p.push(snake(v));
            match (fields, wrapped) {
                (Some(fields), _) => self.table(&p, fields, vdoc),
                (None, Some(ty)) => {
                    if let Some(Item { shape: Shape::Struct(fields), doc }) = self.items.get(&base_type(ty).0).cloned() {
                        self.table(&p, &fields, &doc);
                    }
                }
                _ => {}
            }
        }
    }

    fn is_table(&self, ty: &str) -> bool {
        self.items.contains_key(&base_type(ty).0) && matches!(self.items[&base_type(ty).0].shape, Shape::Struct(_))
            || matches!(self.items.get(&base_type(ty).0), Some(Item { shape: Shape::Enum(v), .. }) if v.iter().any(|(_, f, w, _)| f.is_some() || w.is_some()))
    }
}

/// The reference as Markdown.
pub fn render() -> String {
    let items = items();
    let config = PipelineConfig::parse("source = \"simulator\"\n", "(defaults)").expect("the defaults load");
    let defaults = toml::Value::try_from(&config).expect("a config serializes");
    let mut w = Writer { items: &items, defaults, out: String::new() };
    w.out.push_str(
        "# Configuration reference\n\n\
         Every key of a pipeline config (TOML), its type, its default and its meaning. Generated by\n\
         `ultr config-reference > docs/configuration.md` from the config structs' doc comments and the\n\
         defaults the loader fills in; `tests/laboratory/config.rs` fails when this file is stale.\n\
         Unknown keys are refused, naming the key and the file. Durations are text (`500ms`, `30s`,\n\
         `10m`, `1h`, `28d`); sizes are text (`512MiB`, `2GiB`) or bytes. Types in backticks are named\n\
         values (`tower = \"embedding\"`): their choices are in the meaning column and the README.\n",
    );
    let Shape::Struct(fields) = items["PipelineConfig"].shape.clone() else { unreachable!("PipelineConfig is a struct") };
    w.table(&[], &fields, "");
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_names_every_section_and_a_few_known_keys() {
        let r = render();
        for needle in [
            "`[window]`",
            "`[train.ips]`",
            "`[state.object_store]`",
            "`[source.kafka]`",
            "| `size` | duration | `\"1h\"`",
            "| `max_epochs` | integer |",
            "| `max_event_age` |",
        ] {
            assert!(r.contains(needle), "{needle} missing from the reference");
        }
        // Retired keys, refused by the loader, are not documented as keys.
        assert!(!r.contains("| `identified_by` |"));
    }
}
