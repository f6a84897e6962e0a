//! The malformed-record corpus: every kind of bad input the contract names, with its expected
//! reason. Shared by the acceptance test and the decoder fuzz harness (which seeds from it).

use ultr::session::Reason;

pub fn item(doc: &str, pos: &str, extra: &str) -> String {
    format!(r#"{{"doc_id":"{doc}","position":{pos},"clicked":false,"features":[0.1,0.2,0.3]{extra}}}"#)
}

pub fn session(fields: &str, items: &str) -> String {
    format!(r#"{{"schema_version":1,"session_id":"bad","query_id":"q1","event_time":"2026-01-01T00:00:00Z","policy_id":"p"{fields},"items":[{items}]}}"#)
}

/// (record bytes, expected reason): every kind of bad input the contract names, and then some.
pub fn corpus() -> Vec<(Vec<u8>, Reason)> {
    use Reason::*;
    let ok_items = format!("{},{}", item("a", "1", ""), item("b", "2", ""));
    let mut c: Vec<(Vec<u8>, Reason)> = vec![
        (br#"{"schema_version":1,"session_id":"#.to_vec(), InvalidJson),
        (b"not json at all".to_vec(), InvalidJson),
        (b"{\"schema_version\":1,,}".to_vec(), InvalidJson),
        (b"[1,2,3]".to_vec(), WrongType),
        (vec![0xff, 0xfe, 0x7b, 0x7d], NotUtf8),
        ([br#"{"schema_version":1,"session_id":""#.as_slice(), &[0xc3, 0x28], br#""}"#].concat(), NotUtf8),
        (b"{}".to_vec(), MissingField),
        (br#"{"schema_version":1,"query_id":"q","event_time":0,"policy_id":"p","items":[]}"#.to_vec(), MissingField),
        (br#"{"schema_version":1,"session_id":"s","query_id":"q","event_time":0,"policy_id":"p"}"#.to_vec(), MissingField),
        (session("", r#"{"position":1,"clicked":true}"#).into_bytes(), MissingField),
        (session("", r#"{"doc_id":"a","clicked":true}"#).into_bytes(), MissingField),
        (session("", r#"{"doc_id":"a","position":1}"#).into_bytes(), MissingField),
        (session("", &item("a", "\"1\"", "")).into_bytes(), WrongType),
        (session("", r#"{"doc_id":"a","position":1,"clicked":"yes"}"#).into_bytes(), WrongType),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":"abc"}"#).into_bytes(), WrongType),
        (session("", r#"{"doc_id":"a","position":1.5,"clicked":true}"#).into_bytes(), WrongType),
        (session("", &format!("{},{}", item("a", "1", ""), item("a", "1", ",\"position\":3"))).into_bytes(), WrongType),
        (session_with("session_id", r#"{"x":1}"#, &ok_items), WrongType),
        (session_with("schema_version", "2", &ok_items), UnsupportedSchemaVersion),
        (session_with("schema_version", "\"1\"", &ok_items), WrongType),
        (session_with("event_time", "\"yesterday\"", &ok_items), BadEventTime),
        (session_with("event_time", "-5", &ok_items), BadEventTime),
        (session_with("event_time", "1.5", &ok_items), BadEventTime),
        (session_with("event_time", "\"9999-12-31T00:00:00Z\"", &ok_items), FutureEventTime),
        (session("", "").into_bytes(), NoItems),
        (session("", &(1..=6).map(|k| item(&format!("d{k}"), &k.to_string(), "")).collect::<Vec<_>>().join(",")).into_bytes(), TooManyItems),
        (session("", &item("a", "0", "")).into_bytes(), NonPositivePosition),
        (session("", &item("a", "-3", "")).into_bytes(), NonPositivePosition),
        (session("", &format!("{},{}", item("a", "2", ""), item("b", "2", ""))).into_bytes(), DuplicatePosition),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,"NaN",0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,"-Infinity",0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,1e39,0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,null,0.3]}"#).into_bytes(), NonFiniteFeature),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[0.1,0.2]}"#).into_bytes(), FeatureLengthMismatch),
        (
            session("", &format!("{},{}", item("a", "1", ""), r#"{"doc_id":"b","position":2,"clicked":true,"features":[1,2,3,4]}"#)).into_bytes(),
            FeatureLengthMismatch,
        ),
        (session("", r#"{"doc_id":"a","position":1,"clicked":true,"features":[1,2,3,4,5,6,7,8,9]}"#).into_bytes(), TooManyFeatures),
        (session("", &item("a", "1", ",\"propensity\":0")).into_bytes(), BadPropensity),
        (session("", &item("a", "1", ",\"propensity\":1.5")).into_bytes(), BadPropensity),
        (session_with("session_id", "\"\"", &ok_items), EmptyId),
        (session("", &item("", "1", "")).into_bytes(), EmptyId),
        (session(&format!(r#","context":{{"pad":"{}"}}"#, "x".repeat(5000)), &ok_items).into_bytes(), RecordTooLarge),
    ];
    // Ids longer than decode.max_id_bytes (1 KiB by default) inside a record that fits the record limit.
    c.push((session_with("query_id", &format!("{:?}", "q".repeat(2000)), &ok_items), IdTooLong));
    c.push((session("", &format!("{},{}", item(&"d".repeat(1025), "1", ""), item("b", "2", ""))).into_bytes(), IdTooLong));
    // A position beyond u32.
    c.push((session("", &item("a", "4294967296", "")).into_bytes(), WrongType));
    // bias_features: NaN, and a length that disagrees within the session.
    c.push((session("", &item("a", "1", ",\"bias_features\":[0.5,\"NaN\"]")).into_bytes(), NonFiniteFeature));
    c.push((
        session("", &format!("{},{}", item("a", "1", ",\"bias_features\":[0.5,0.1]"), item("b", "2", ",\"bias_features\":[0.5]"))).into_bytes(),
        FeatureLengthMismatch,
    ));
    // A negative propensity, and NaN (JSON has no NaN literal; a string is the wrong type).
    c.push((session("", &item("a", "1", ",\"propensity\":-0.2")).into_bytes(), BadPropensity));
    c.push((session("", &item("a", "1", ",\"propensity\":\"NaN\"")).into_bytes(), WrongType));
    // A nested context value (context values are strings, numbers or booleans).
    c.push((session(r#","context":{"device":{"os":"ios"}}"#, &ok_items).into_bytes(), WrongType));
    // A bad record must not be confused with a good one carrying the same id.
    c.push((session("", &format!("{},{}", item("a", "1", ""), item("b", "1", ""))).into_bytes(), DuplicatePosition));
    c
}

pub fn session_with(key: &str, value: &str, items: &str) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_str(&session("", items)).unwrap();
    let raw = format!(r#"{{"{key}":{value}}}"#);
    let patch: serde_json::Value = serde_json::from_str(&raw).unwrap();
    v[key] = patch[key].clone();
    serde_json::to_vec(&v).unwrap()
}

/// Records refused only on a live stream (Kafka), where the wall clock judges event times from
/// below as well; a replay accepts them.
pub fn live_only() -> Vec<(Vec<u8>, Reason)> {
    let ok_items = format!("{},{}", item("a", "1", ""), item("b", "2", ""));
    vec![(session_with("event_time", "\"1970-01-01T00:00:01Z\"", &ok_items), Reason::StaleEventTime)]
}
