//! Benchmarks for tower-window. See `README.md`: the `redis_load` binary
//! measures decisions per second through `Limiter::check` on a real Redis;
//! the `bench_server` binary is the HTTP server of the load benchmark
//! (`benches/load/run.sh`), one axum route behind each limiter variant.

pub mod redis_stats;
