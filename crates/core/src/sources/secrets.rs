//! Client properties whose secrets live outside the config: `env:NAME` and `file:PATH` values.

use std::collections::BTreeMap;

use anyhow::Context;

/// Resolves every `env:NAME` value from the environment and every `file:PATH` value from a file
/// (one trailing newline dropped, as secret mounts write them). Other values pass through. An
/// error names the property and where it looked, never the secret.
pub fn resolve_properties(properties: &BTreeMap<String, String>) -> anyhow::Result<BTreeMap<String, String>> {
    properties.iter().map(|(k, v)| Ok((k.clone(), resolve(k, v)?))).collect()
}

fn resolve(key: &str, value: &str) -> anyhow::Result<String> {
    if let Some(var) = value.strip_prefix("env:") {
        return std::env::var(var).with_context(|| format!("property `{key}`: environment variable {var} is not set"));
    }
    if let Some(path) = value.strip_prefix("file:") {
        let text = std::fs::read_to_string(path).with_context(|| format!("property `{key}`: cannot read secret file {path}"))?;
        return Ok(text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_string());
    }
    Ok(value.to_string())
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn secrets_come_from_files_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\n").unwrap();
        std::env::set_var("ULTR_TEST_SECRET_USER", "alice");
        let props: BTreeMap<String, String> = [
            ("sasl.password".to_string(), format!("file:{}", file.display())),
            ("sasl.username".to_string(), "env:ULTR_TEST_SECRET_USER".to_string()),
            ("security.protocol".to_string(), "sasl_ssl".to_string()),
        ]
        .into();
        let out = resolve_properties(&props).unwrap();
        assert_eq!(out["sasl.password"], "s3cret");
        assert_eq!(out["sasl.username"], "alice");
        assert_eq!(out["security.protocol"], "sasl_ssl");
        let missing: BTreeMap<String, String> = [("sasl.password".to_string(), "env:ULTR_TEST_SECRET_UNSET".to_string())].into();
        let err = resolve_properties(&missing).unwrap_err().to_string();
        assert!(err.contains("sasl.password") && err.contains("ULTR_TEST_SECRET_UNSET"), "{err}");
    }
}
