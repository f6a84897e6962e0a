//! What a scenario's series export at a given minute, for tests that run the judges on the scenarios promtool runs (the alert catalog's and the status page's).

use ultr::monitor::board::BoardState;
use ultr::monitor::exposition::{Sample, Series};
use ultr::monitor::metrics::name;
use ultr::monitor::signals::{threshold, Input};

/// promtool's expanding notation, one value per minute: `a`, `axn` and `a+bxn` / `a-bxn` (n + 1
/// values), `_` (no sample) and `_xn` (n of them).
pub fn expand(values: &str) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for token in values.split_whitespace() {
        let (head, times) = match token.split_once('x') {
            Some((h, n)) => (h, Some(n.parse::<usize>().unwrap())),
            None => (token, None),
        };
        if head == "_" {
            out.extend(std::iter::repeat_n(None, times.unwrap_or(1)));
            continue;
        }
        let split = head.char_indices().skip(1).find(|(_, c)| *c == '+' || *c == '-').map(|(i, _)| i);
        let (start, step) = match split {
            Some(i) => (head[..i].parse::<f64>().unwrap(), head[i..].parse::<f64>().unwrap()),
            None => (head.parse::<f64>().unwrap(), 0.0),
        };
        out.extend((0..=times.unwrap_or(0)).map(|k| Some(start + step * k as f64)));
    }
    out
}

/// The value an instant query sees at `minute`: the last sample at or before it, within
/// Prometheus's 5-minute lookback.
pub fn value_at(values: &[Option<f64>], minute: usize) -> Option<f64> {
    (minute.saturating_sub(5)..=minute).rev().find_map(|m| values.get(m).copied().flatten())
}

/// `40m`, `28h`, `26h5m` in minutes.
pub fn minutes(at: &str) -> usize {
    let (hours, rest) = at.split_once('h').map_or((0, at), |(h, r)| (h.parse::<usize>().unwrap(), r));
    hours * 60 + rest.strip_suffix('m').map_or(0, |m| m.parse::<usize>().unwrap())
}

/// What `instance` exports at `minute` of `inputs` (its `instance` label dropped, as the service
/// exports it), and its board of counter samples over the minutes before (the rates' input).
pub fn exported(inputs: &[Input], instance: &str, minute: usize) -> (Series, BoardState) {
    let ours: Vec<(Sample, Vec<Option<f64>>)> = inputs
        .iter()
        .map(|i| {
            let mut parsed = ultr::monitor::exposition::parse_exposition(&format!("{} 0", i.series)).remove(0);
            let mine = parsed.labels.remove("instance").as_deref() == Some(instance);
            (mine, parsed, expand(&i.values))
        })
        .filter(|(mine, _, _)| *mine)
        .map(|(_, s, v)| (s, v))
        .collect();
    let at = |m: usize| ours.iter().filter_map(|(s, v)| value_at(v, m).map(|value| Sample { value, ..s.clone() })).collect::<Vec<_>>();
    let total = |m: usize, metric: &str| at(m).iter().filter(|s| s.name == metric).map(|s| s.value as u64).sum::<u64>();
    let mut board = BoardState::default();
    let span = threshold::INGEST_ERROR_RATE_SPAN_MINUTES as usize;
    for m in minute.saturating_sub(span)..=minute {
        let (records, bad_records) = (total(m, name::RECORDS_TOTAL), total(m, name::BAD_RECORDS_TOTAL));
        board.samples.push_back(ultr::monitor::board::CounterSample { unix_s: m as f64 * 60.0, records, sessions: records, bad_records });
    }
    (Series::new(at(minute)), board)
}
