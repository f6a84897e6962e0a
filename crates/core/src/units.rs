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
