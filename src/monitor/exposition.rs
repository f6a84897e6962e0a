//! The exported series looked up by name and labels, as the alert conditions and the status page read
//! them (from the registry's typed values, `Metrics::series`), and Prometheus's text exposition format
//! read back into them (scraped text; the tests' fixtures).

use std::collections::BTreeMap;

/// One series of the text exposition format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus's text exposition format (what `Metrics::render` writes): comment lines are
/// skipped, label values are unescaped (`\\`, `\"`, `\n`).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let mut labels = BTreeMap::new();
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    rest = &inner[i + 1..];
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            '"' => break,
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        }
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name, labels, value })
}

/// The exported series, looked up by name and labels.
pub struct Series(Vec<Sample>);

impl Series {
    pub fn new(samples: Vec<Sample>) -> Series {
        Series(samples)
    }

    /// Every sample, in the order they were given.
    pub fn samples(&self) -> &[Sample] {
        &self.0
    }

    /// The value of the one series `name` whose labels include `labels`, if exported.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.all(name).find(|s| labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))).map(|s| s.value)
    }

    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| s.name == name)
    }

    /// Sum over every series of `name`.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut it = self.all(name).peekable();
        it.peek()?;
        Some(it.map(|s| s.value).sum())
    }

    /// Per-position values of a series labelled `position`, in position order.
    pub fn by_position(&self, name: &str, extra: &[(&str, &str)]) -> BTreeMap<u32, f64> {
        self.all(name)
            .filter(|s| extra.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .filter_map(|s| Some((s.labels.get("position")?.parse().ok()?, s.value)))
            .collect()
    }
}
