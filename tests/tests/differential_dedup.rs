//! Differential test of dedup windows on memory, Redis and the cluster
//! against the model (see `tower_window_tests::differential::dedup`).

#[test]
fn dedup_matches_the_model_on_every_store() {
    tower_window_tests::differential::run_capability::<
        tower_window_tests::differential::dedup::Dedup,
    >();
}
