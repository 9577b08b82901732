# Shared by rls_table.sh and rls_profile.sh (sourced, not run): their own
# redis-server and the rules both serve.

# Starts a redis-server on a random loopback port below 55535, logging to
# $1/redis.log; appends its pid to `pids` and sets `redis_url`.
start_redis() {
    local dir=$1 port pid
    for _ in $(seq 20); do
        port=$((20000 + RANDOM % 35000))
        redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no >"$dir/redis.log" 2>&1 &
        pid=$!
        sleep 0.3
        if kill -0 "$pid" 2>/dev/null && redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
            pids+=("$pid")
            redis_url=redis://127.0.0.1:$port
            return 0
        fi
        kill "$pid" 2>/dev/null || true
    done
    die "could not start redis-server"
}

# The rules file both benchmarks serve: one hot key, a limit never reached.
write_rules() {
    cat >"$1/rules.yaml" <<'RULES'
domain: bench
algorithm: sliding-counter
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
RULES
}
