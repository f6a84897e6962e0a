//! `ultr::config_reference`: The generated configuration reference names every section and known keys.

use ultr::config_reference::*;

#[test]
fn the_reference_names_every_section_and_a_few_known_keys() {
    let r = render();
    for needle in [
        "`[window]`",
        "`[train.ips]`",
        "`[train.dla]`",
        "`[train.observation_tower]`",
        "`[state.object_store]`",
        "`[source.kafka]`",
        "| `size` | duration | `\"1h\"`",
        "| `max_epochs` | integer |",
        "| `max_event_age` |",
        "| `model` | `ModelKind` | `\"additive\"` |",
        "`\"drop_repeats\"`",
    ] {
        assert!(r.contains(needle), "{needle} missing from the reference");
    }
    // Retired keys, refused by the loader, are not documented as keys.
    assert!(!r.contains("| `identified_by` |"));
    // The models' sections are tables of their own, not keys of `[train]`.
    assert!(!r.contains("| `dla` |"));
}
