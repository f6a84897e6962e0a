//! Released click logs in the Yandex relevance-prediction layout (the format of PyClick, of Yandex's
//! and NAVER's released logs, CLARA 2 among them) turned into the session contract: one result page
//! is one session (the mapping: `docs/click-log-import.md`).
//!
//! Pure logic: lines in, contract records and refusals out; `crate::import` does the reading and
//! writing. A log session's pages are held until the session ends, because a click may come after a
//! later page and belongs to the latest page that showed its URL.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

/// Why a line (or a page) of the log was not imported; the label is what its dead letter carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ImportReason {
    /// Not a query or click line of the layout: too few fields, a non-integer time, an unknown
    /// action type, a URL list in another layout.
    MalformedLine,
    /// A click on a URL that no earlier page of its session showed.
    ClickWithoutPage,
}

impl ImportReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ImportReason::MalformedLine => "malformed_log_line",
            ImportReason::ClickWithoutPage => "click_without_page",
        }
    }
}

/// How the log's time field becomes `event_time`: `base + time × unit`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeMapping {
    pub base_ms: i64,
    /// Milliseconds per unit of the log's time field.
    pub unit_ms: f64,
}

/// What the importer gives back for the lines it was fed.
#[derive(Debug, Clone, PartialEq)]
pub enum Imported {
    /// A session-contract record (one JSON line), keyed by its query id.
    Session { key: String, json: String, items: usize, clicks: usize },
    /// A refused line or page: where it starts in the log (1-based line, byte offset), its bytes as
    /// the log has them.
    Refused { line: u64, offset: u64, reason: ImportReason, detail: String, payload: Vec<u8> },
}

struct Page {
    line: u64,
    offset: u64,
    text: String,
    query: String,
    region: String,
    time: i64,
    urls: Vec<String>,
    clicked: Vec<bool>,
}

/// Feeds lines in log order; completed sessions come out page by page.
pub struct ClickLogImporter {
    time: TimeMapping,
    policy_id: String,
    session: Option<String>,
    pages: Vec<Page>,
    line: u64,
}

#[derive(Serialize)]
struct ContractSession<'a> {
    schema_version: u32,
    session_id: String,
    query_id: &'a str,
    event_time: String,
    policy_id: &'a str,
    context: BTreeMap<&'static str, &'a str>,
    items: Vec<ContractItem<'a>>,
}

#[derive(Serialize)]
struct ContractItem<'a> {
    doc_id: &'a str,
    position: u32,
    clicked: bool,
}

impl ClickLogImporter {
    pub fn new(time: TimeMapping, policy_id: &str) -> Self {
        ClickLogImporter { time, policy_id: policy_id.to_string(), session: None, pages: Vec::new(), line: 0 }
    }

    /// One line of the log, without its line break, starting at byte `offset`.
    pub fn push_line(&mut self, text: &str, offset: u64, out: &mut Vec<Imported>) {
        self.line += 1;
        let line = self.line;
        let refuse = |detail: String| Imported::Refused { line, offset, reason: ImportReason::MalformedLine, detail, payload: text.as_bytes().to_vec() };
        let trimmed = text.trim_end_matches(['\r', '\n']);
        // Released logs pad click lines with empty fields to the width of query lines.
        let mut fields: Vec<&str> = trimmed.split('\t').collect();
        while fields.last().is_some_and(|f| f.trim().is_empty()) {
            fields.pop();
        }
        if fields.len() < 4 {
            out.push(refuse(format!(
                "line {line}: {} field(s); a line is SessionID, TimePassed, Q or C, then the query's or the click's fields",
                fields.len()
            )));
            return;
        }
        let session = fields[0].trim();
        if session.is_empty() {
            out.push(refuse(format!("line {line}: empty SessionID")));
            return;
        }
        let time: i64 = match fields[1].trim().parse() {
            Ok(t) => t,
            Err(_) => {
                out.push(refuse(format!("line {line}: TimePassed {:?} is not an integer", fields[1])));
                return;
            }
        };
        match fields[2].trim() {
            "Q" => {
                if fields.len() < 6 {
                    out.push(refuse(format!("line {line}: a query line is SessionID, TimePassed, Q, QueryID, RegionID and at least one URL")));
                    return;
                }
                let urls: Vec<String> = fields[5..].iter().map(|u| u.trim().to_string()).collect();
                if let Some(bad) = urls.iter().find(|u| u.is_empty() || u.contains(',')) {
                    let why = if bad.is_empty() {
                        "an empty URL field inside the list".to_string()
                    } else {
                        format!("URL {bad:?} holds a comma (the WSCD 2012 layout's url,domain pairs; only the relevance-prediction layout is read)")
                    };
                    out.push(refuse(format!("line {line}: {why}")));
                    return;
                }
                let query = fields[3].trim();
                if query.is_empty() {
                    out.push(refuse(format!("line {line}: empty QueryID")));
                    return;
                }
                if self.session.as_deref() != Some(session) {
                    self.finish(out);
                    self.session = Some(session.to_string());
                }
                let n = urls.len();
                self.pages.push(Page {
                    line,
                    offset,
                    text: text.to_string(),
                    query: query.to_string(),
                    region: fields[4].trim().to_string(),
                    time,
                    urls,
                    clicked: vec![false; n],
                });
            }
            "C" => {
                if fields.len() != 4 {
                    out.push(refuse(format!("line {line}: a click line is SessionID, TimePassed, C and one URL; it has {} fields", fields.len())));
                    return;
                }
                let url = fields[3].trim();
                if self.session.as_deref() != Some(session) {
                    // A session that opens with a click, or a click after its session ended.
                    self.finish(out);
                    self.session = Some(session.to_string());
                }
                // The latest page of the session that showed the URL.
                let target = self.pages.iter_mut().rev().find_map(|p| p.urls.iter().position(|u| u == url).map(|i| (p, i)));
                match target {
                    Some((page, i)) => page.clicked[i] = true,
                    None => out.push(Imported::Refused {
                        line,
                        offset,
                        reason: ImportReason::ClickWithoutPage,
                        detail: format!("line {line}: a click on URL {url} that no earlier page of session {session} showed"),
                        payload: text.as_bytes().to_vec(),
                    }),
                }
            }
            other => out.push(refuse(format!("line {line}: action type {other:?}; the layout has Q (a result page) and C (a click)"))),
        }
    }

    /// A line that is not UTF-8 text: refused as it stands, counted like any other line.
    pub fn push_undecodable(&mut self, bytes: &[u8], offset: u64, out: &mut Vec<Imported>) {
        self.line += 1;
        let line = self.line;
        out.push(Imported::Refused { line, offset, reason: ImportReason::MalformedLine, detail: format!("line {line}: not UTF-8"), payload: bytes.to_vec() });
    }

    /// Lines fed so far.
    pub fn lines(&self) -> u64 {
        self.line
    }

    /// Ends the current session: its pages come out, in log order.
    pub fn finish(&mut self, out: &mut Vec<Imported>) {
        let Some(session) = self.session.take() else { return };
        for page in std::mem::take(&mut self.pages) {
            out.push(self.page_record(&session, page));
        }
    }

    fn page_record(&self, session: &str, page: Page) -> Imported {
        let refused = |reason: ImportReason, detail: String| Imported::Refused {
            line: page.line,
            offset: page.offset,
            reason,
            detail,
            payload: page.text.clone().into_bytes(),
        };
        // A page that shows one URL twice is written as shown (a click on the URL marks its first
        // occurrence); the decoder drops the repeat or refuses the page (`[decode] duplicate_doc_id`).
        let event_ms = (page.time as f64 * self.time.unit_ms).round();
        let event_time = (event_ms.is_finite() && event_ms.abs() < 9.0e15)
            .then(|| self.time.base_ms.checked_add(event_ms as i64))
            .flatten()
            .and_then(DateTime::<Utc>::from_timestamp_millis);
        let Some(event_time) = event_time else {
            return refused(ImportReason::MalformedLine, format!("line {}: TimePassed {} from the base time is outside the calendar", page.line, page.time));
        };
        let mut context = BTreeMap::new();
        context.insert("region", page.region.as_str());
        let record = ContractSession {
            schema_version: 1,
            // The log's session and the page's line: unique even where a session id repeats, and the
            // same on every import of the same log (a re-import is a duplicate, counted once).
            session_id: format!("{session}/{}", page.line),
            query_id: &page.query,
            event_time: event_time.to_rfc3339_opts(SecondsFormat::Millis, true),
            policy_id: &self.policy_id,
            context,
            items: page.urls.iter().zip(&page.clicked).enumerate().map(|(i, (u, c))| ContractItem { doc_id: u, position: i as u32 + 1, clicked: *c }).collect(),
        };
        let json = serde_json::to_string(&record).expect("a contract record serializes");
        Imported::Session { key: page.query.clone(), json, items: page.urls.len(), clicks: page.clicked.iter().filter(|c| **c).count() }
    }
}

/// What an import did, by count.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct ImportSummary {
    pub lines: u64,
    pub sessions: u64,
    pub impressions: u64,
    pub clicks: u64,
    pub refused: BTreeMap<&'static str, u64>,
}

impl ImportSummary {
    pub fn add(&mut self, imported: &Imported) {
        match imported {
            Imported::Session { items, clicks, .. } => {
                self.sessions += 1;
                self.impressions += *items as u64;
                self.clicks += *clicks as u64;
            }
            Imported::Refused { reason, .. } => *self.refused.entry(reason.as_str()).or_default() += 1,
        }
    }
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    fn import(lines: &[&str]) -> Vec<Imported> {
        let mut imp = ClickLogImporter::new(TimeMapping { base_ms: 1_767_225_600_000, unit_ms: 1.0 }, "logged");
        let mut out = Vec::new();
        for l in lines {
            imp.push_line(l, 0, &mut out);
        }
        imp.finish(&mut out);
        out
    }

    fn session(out: &Imported) -> serde_json::Value {
        match out {
            Imported::Session { json, .. } => serde_json::from_str(json).unwrap(),
            other => panic!("expected a session, got {other:?}"),
        }
    }

    pub fn a_click_goes_to_the_latest_page_that_showed_the_url() {
        let out = import(&["7\t0\tQ\t11\t0.0\ta\tb\tc", "7\t5\tQ\t12\t0.0\tc\ta", "7\t9\tC\ta\t\t\t", "7\t12\tC\tb", "8\t0\tQ\t11\t0.0\tb\ta"]);
        assert_eq!(out.len(), 3);
        let (first, second, third) = (session(&out[0]), session(&out[1]), session(&out[2]));
        assert_eq!(first["session_id"], "7/1");
        assert_eq!(first["query_id"], "11");
        // b was only on the first page; a was on both, so its click is the second page's.
        let clicked = |s: &serde_json::Value| s["items"].as_array().unwrap().iter().map(|i| i["clicked"].as_bool().unwrap()).collect::<Vec<_>>();
        assert_eq!(clicked(&first), vec![false, true, false]);
        assert_eq!(clicked(&second), vec![false, true]);
        assert_eq!(second["event_time"], "2026-01-01T00:00:00.005Z");
        assert_eq!(clicked(&third), vec![false, false]);
        assert_eq!(third["items"][1]["position"], 2);
    }

    pub fn bad_lines_are_refused_with_their_reason_and_the_rest_imports() {
        let out = import(&[
            "1\tx\tQ\t11\t0\ta",          // time not an integer
            "1\t0\tQ\t11\t0",             // no URLs
            "1\t0\tZ\t11",                // unknown action
            "1\t0\tQ\t11\t0\ta,d1\tb,d2", // WSCD 2012 url,domain pairs
            "1\t0\tC\tzz",                // click before any page
            "1\t1\tQ\t11\t0\ta\tb\ta",    // one URL twice
            "1\t2\tC\ta",
            "2\t0\tQ\t12\t0\tu\tv",
            "",
        ]);
        let reasons: Vec<&str> = out
            .iter()
            .map(|o| match o {
                Imported::Refused { reason, .. } => reason.as_str(),
                Imported::Session { .. } => "session",
            })
            .collect();
        assert_eq!(
            reasons,
            vec![
                "malformed_log_line",
                "malformed_log_line",
                "malformed_log_line",
                "malformed_log_line",
                "click_without_page",
                "session",
                "malformed_log_line",
                "session"
            ]
        );
        let mut summary = ImportSummary::default();
        out.iter().for_each(|o| summary.add(o));
        // The page showing `a` twice is kept whole, its click on the first `a`.
        assert_eq!((summary.sessions, summary.impressions, summary.clicks), (2, 5, 1));
        let Imported::Session { json, .. } = &out[5] else { panic!("{:?}", out[5]) };
        let page: serde_json::Value = serde_json::from_str(json).unwrap();
        let clicked: Vec<bool> = page["items"].as_array().unwrap().iter().map(|i| i["clicked"].as_bool().unwrap()).collect();
        assert_eq!(clicked, vec![true, false, false]);
    }
}
