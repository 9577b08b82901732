//! Benchmarks for tower-window. See `README.md`: the `redis_load` binary
//! measures decisions per second through `Limiter::check` on a real Redis.
