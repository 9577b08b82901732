//! Differential test of event windows on memory, Redis and the cluster
//! against the model (see `tower_window_tests::differential::events`).

#[test]
fn events_match_the_model_on_every_store() {
    tower_window_tests::differential::run_capability::<
        tower_window_tests::differential::events::Events,
    >();
}
