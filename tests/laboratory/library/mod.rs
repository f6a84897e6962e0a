//! The `ultr` library's own unit-level tests (the alert catalog, the status page, the schedule, the
//! configuration reference): in this binary, so that the library has no unit-test build, a second
//! whole compile of `src/` (about 90 s of CPU on the 2-core machine).

mod board;
mod config_reference;
mod rules_time;
mod scenario_values;
mod schedule;
mod signals;
mod status_page;
