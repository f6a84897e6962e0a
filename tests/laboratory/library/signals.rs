//! `ultr::monitor::signals`: The alert catalog: names, thresholds, promtool's value notation.

use ultr::monitor::signals::*;

/// Every rule has a unique name, and the expressions carry the catalog's thresholds as
/// Prometheus reads them (a threshold written as the constant's shortest decimal).
#[test]
fn each_rule_is_named_once_and_compares_against_the_catalogs_thresholds() {
    let names: std::collections::BTreeSet<_> = alert_rules().iter().map(|r| r.name).collect();
    assert_eq!(names.len(), alert_rules().len());
    let expr = |n: &str| alert_rules().iter().find(|r| r.name == n).unwrap().expr.clone();
    assert_eq!(expr("MisspecificationSuspected"), "ultr_misspecification_z > 4");
    assert_eq!(expr("ResidualDrift"), "ultr_residual_psi > 0.2 or ultr_residual_page_hinkley > 0.5");
    assert_eq!(expr("ConsumerLagHigh"), "max by (instance, topic) (ultr_kafka_consumer_lag_messages) > 100000");
    assert_eq!(severity("KafkaSourceDown"), Severity::Critical);
}

/// The expanding notation as promtool documents it.
#[test]
fn promtool_values_expand_as_documented() {
    use super::scenario_values::{expand, minutes, value_at};
    assert_eq!(expand("1x2 0+10x2 5-1x1 _x2 NaN").len(), 3 + 3 + 2 + 2 + 1);
    assert_eq!(expand("0+10x2")[2], Some(20.0));
    assert_eq!(expand("5-1x1")[1], Some(4.0));
    assert_eq!(value_at(&expand("1x2 _x3"), 4), Some(1.0));
    assert_eq!(value_at(&expand("1x2 _x10"), 9), None);
    assert_eq!((minutes("40m"), minutes("28h"), minutes("26h5m")), (40, 1680, 1565));
}
