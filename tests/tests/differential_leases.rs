//! Differential test of leases on memory, Redis and the cluster against
//! the model (see `tower_window_tests::differential::quotas`).

#[test]
fn leases_match_the_model_on_every_store() {
    tower_window_tests::differential::run_capability::<
        tower_window_tests::differential::quotas::Leases,
    >();
}
