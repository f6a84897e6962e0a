//! Durations and byte sizes as config files write them (`10m`, `2GiB`), shared by every stage's config.

/// Parses `500ms`, `30s`, `10m`, `1h`, `28d`, `1h 30m` (humantime's syntax) into milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<i64, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| format!("`{text}` is not a duration like 30s, 10m, 1h, 28d ({e})"))?;
    i64::try_from(d.as_millis()).map_err(|_| format!("`{text}` is too long"))
}

/// Parses `1073741824`, `512MiB`, `2GiB`, `64KiB`, `1GB` (binary and decimal units) into bytes.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number.parse().map_err(|_| format!("`{text}` is not a size like 512MiB or 2GiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("`{text}`: unknown unit `{other}` (B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    n.checked_mul(scale).and_then(|b| usize::try_from(b).ok()).filter(|b| *b > 0).ok_or_else(|| format!("`{text}` must be > 0 and fit in memory"))
}

/// A duration as a config file writes it (`500ms`, `30s`, `10m`, `1h`, `28d`), parsed once when the
/// config is read: a value that does not parse is refused at load, so no use site parses again or
/// falls back to a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDuration {
    text: String,
    ms: i64,
}

impl ConfigDuration {
    /// Milliseconds.
    pub fn ms(&self) -> i64 {
        self.ms
    }

    /// As a `std::time::Duration` (a negative duration is zero).
    pub fn std(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ms.max(0) as u64)
    }

    /// The text it was written as.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl std::str::FromStr for ConfigDuration {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Ok(ConfigDuration { ms: parse_duration_ms(text)?, text: text.to_string() })
    }
}

impl std::fmt::Display for ConfigDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for ConfigDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for ConfigDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A size in bytes as a config file writes it (`512MiB`, `2GiB`, or bytes), parsed once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigBytes {
    text: String,
    bytes: usize,
}

impl ConfigBytes {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

impl std::str::FromStr for ConfigBytes {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Ok(ConfigBytes { bytes: parse_bytes(text)?, text: text.to_string() })
    }
}

impl std::fmt::Display for ConfigBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for ConfigBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for ConfigBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A duration or size literal of the code's own defaults (a typo there is a bug, caught by every
/// test that builds a default config).
pub fn duration(text: &str) -> ConfigDuration {
    text.parse().unwrap_or_else(|e| panic!("default duration {text:?}: {e}"))
}

pub fn bytes(text: &str) -> ConfigBytes {
    text.parse().unwrap_or_else(|e| panic!("default size {text:?}: {e}"))
}

/// A config scalar written as a string (`"30s"`, `"64MiB"`) in the config reference
/// (`docs/configuration.md`): its JSON type, and the `format` the reference prints as its type.
macro_rules! config_scalar_schema {
    ($ty:ident, $format:literal) => {
        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "format": $format })
            }

            fn inline_schema() -> bool {
                true
            }
        }
    };
}

config_scalar_schema!(ConfigDuration, "duration");
config_scalar_schema!(ConfigBytes, "size");
