#!/usr/bin/env bash
# Issue 25's benchmark: decisions per second of the examples' `rls` (Envoy's
# ShouldRateLimit over gRPC, driven by `rls_load`, a tonic client) against
# the gateway's HTTP path (`gateway`, driven by wrk), both on one
# redis-server of this script's own, without and with quota leases. The
# variants run interleaved, round by round; the table shows each one's
# median round, the server's CPU time per decision and decisions per server
# CPU-second ("per core": what the target compares, since client and server
# share the machine's cores).
#
#   bash benches/load/rls_table.sh
#   DURATION=5 ROUNDS=5 LEASE=100 bash benches/load/rls_table.sh
#   RLS=/tmp/rls-base CLIENT=tonic bash benches/load/rls_table.sh
#
# Both servers: one hot key (USERS=1), a limit never reached
# (1000000000/1s), the sliding counter, metrics on (the gateway always
# serves /metrics; the rls gets --metrics-listen), the same Redis time
# budget, $WORKERS runtime workers. 32 requests in flight for both (wrk:
# 32 connections; rls_load: 4 HTTP/2 connections x 8 calls each, as Envoy
# multiplexes its calls on few connections).
# Needs: cargo, redis-server, wrk. Every process it starts is killed on exit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
LEASE=${LEASE:-100}
WORKERS=${WORKERS:-$(nproc)}
CONNECTIONS=${CONNECTIONS:-32}
# rls-redis-tonic: the rls served by tonic's own server (--grpc-server tonic).
VARIANTS=${VARIANTS:-"gateway-redis rls-redis gateway-redis-lease rls-redis-lease rls-redis-tonic"}

die() { echo "rls_table.sh: $*" >&2; exit 1; }
command -v redis-server >/dev/null || die "redis-server not found"
command -v wrk >/dev/null || die "wrk not found (apt-get install wrk)"

target_dir=${CARGO_TARGET_DIR:-$root/target}
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
# RLS, GATEWAY, RLS_LOAD: binaries copied aside (a base build, say) to run
# instead of this tree's.
if [ -z "${RLS:-}" ] || [ -z "${GATEWAY:-}" ] || [ -z "${RLS_LOAD:-}" ]; then
    (cd "$root" && cargo build --release --quiet -p tower-window-examples --bin gateway --bin rls \
        -p tower-window-benches --bin rls_load) || die "cargo build failed"
fi
RLS=${RLS:-$target_dir/release/rls}
GATEWAY=${GATEWAY:-$target_dir/release/gateway}
RLS_LOAD=${RLS_LOAD:-$target_dir/release/rls_load}
# rls_load's client: `envoy` sends each call as Envoy's gRPC client does
# (HEADERS with grpc-timeout, one DATA frame ending the stream); `tonic`
# adds an empty DATA frame per call that Envoy does not send.
CLIENT=${CLIENT:-envoy}

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# Our own redis-server on a random loopback port below 55535, and the rules.
. "$(dirname "${BASH_SOURCE[0]}")/rls_common.sh"
start_redis "$tmp"
write_rules "$tmp"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# Starts variant $1; sets $server_pid and $server_addr.
start_server() {
    local variant=$1 log="$tmp/server-$1.log" lease=() grpc=()
    case $variant in *-lease*) lease=(--lease "$LEASE") ;; esac
    case $variant in *-tonic) grpc=(--grpc-server tonic) ;; esac
    case $variant in
    gateway*)
        TOKIO_WORKER_THREADS=$WORKERS RUST_LOG=info "$GATEWAY" \
            --listen 127.0.0.1:0 --limit 1000000000/1s --algorithm sliding-counter \
            --redis-url "$redis_url" "${lease[@]}" >"$log" 2>&1 &
        pattern='s/.*listening address=\([0-9.:]*\).*/\1/p'
        ;;
    rls*)
        TOKIO_WORKER_THREADS=$WORKERS RUST_LOG=info "$RLS" --listen 127.0.0.1:0 \
            --metrics-listen 127.0.0.1:0 --config "$tmp/rules.yaml" \
            --redis-url "$redis_url" "${lease[@]}" "${grpc[@]}" >"$log" 2>&1 &
        pattern='s/.*serving envoy.service.ratelimit.v3.RateLimitService address=\([0-9.:]*\).*/\1/p'
        ;;
    esac
    server_pid=$!
    pids+=("$server_pid")
    server_addr=
    for _ in $(seq 300); do
        server_addr=$(sed -n "$pattern" "$log" | head -1)
        [ -n "$server_addr" ] && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.05
    done
    cat "$log" >&2
    die "$variant did not start"
}

# Load for $2 seconds against variant $1; prints "requests=N ok=N ...".
load() {
    local variant=$1 seconds=$2
    case $variant in
    gateway*)
        WRK_USERS=1 WRK_THREADS=2 timeout $((seconds + 30)) wrk -t 2 -c "$CONNECTIONS" \
            -d "${seconds}s" --timeout 2s -s "$here/rotate.lua" "http://$server_addr/api/hello" |
            sed -n 's/^RESULT //p' |
            awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                   printf "requests=%d ok=%d over_limit=%d errors=%d\n", v["s2xx"] + v["s429"] + v["other"], v["s2xx"], v["s429"], v["other"] + v["errors"] }'
        ;;
    rls*)
        timeout $((seconds + 60)) "$RLS_LOAD" --target "http://$server_addr" --connections 4 \
            --concurrency $((CONNECTIONS / 4)) --seconds "$seconds" --warmup 0 --domain bench --key user \
            --client "$CLIENT"
        ;;
    esac
}

declare -A line
for round in $(seq "$ROUNDS"); do
    for variant in $VARIANTS; do
        # A run that printed nothing (a load client that could not connect
        # on a machine this busy) is tried once more.
        for attempt in 1 2; do
            start_server "$variant"
            [ "$WARMUP" -gt 0 ] && { load "$variant" "$WARMUP" >/dev/null || true; }
            before=$(cpu_ticks "$server_pid")
            out=$(load "$variant" "$DURATION" || true)
            after=$(cpu_ticks "$server_pid")
            kill "$server_pid" 2>/dev/null || true
            wait "$server_pid" 2>/dev/null || true
            grep -q 'requests=[0-9]' <<<"$out" && break
            echo "round $round, $variant: attempt $attempt printed no result; server log:" >&2
            tail -5 "$tmp/server-$variant.log" >&2
        done
        requests=$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$out")
        errors=$(sed -n 's/.*errors=\([0-9]*\).*/\1/p' <<<"$out")
        [ -n "$requests" ] || die "$variant printed no result: $out"
        line[$variant,$round]=$(awk -v n="$requests" -v e="$errors" -v s="$DURATION" -v t=$((after - before)) \
            -v hz="$(getconf CLK_TCK)" 'BEGIN { cpu = t / hz; printf "%.0f %.1f %.0f %d", n / s, n ? cpu * 1e6 / n : 0, cpu ? n / cpu : 0, e }')
        echo "round $round, $variant: rps cpu_us/req per_cpu_s errors = ${line[$variant,$round]}" >&2
    done
done

echo "$ROUNDS rounds of ${DURATION}s (after ${WARMUP}s warm-up), interleaved; one hot key; $CONNECTIONS in flight; rls_load --client $CLIENT; $WORKERS server workers; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| variant | decisions/s (median) | server CPU µs/decision (median) | decisions per server CPU-second (median) | errors | decisions/s of each round | per CPU-second of each round |"
echo "|---|---:|---:|---:|---:|---|---|"
declare -A per_cpu
for variant in $VARIANTS; do
    rps=() cpu=() per=() errs=0
    for round in $(seq "$ROUNDS"); do
        read -r r c p e <<<"${line[$variant,$round]}"
        rps+=("$r") cpu+=("$c") per+=("$p") errs=$((errs + e))
    done
    median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }
    per_cpu[$variant]=$(median "${per[@]}")
    echo "| $variant | $(median "${rps[@]}") | $(median "${cpu[@]}") | ${per_cpu[$variant]} | $errs | ${rps[*]} | ${per[*]} |"
done
echo
echo "| target | ratio (per CPU-second, medians) |"
echo "|---|---:|"
for pair in "rls-redis gateway-redis" "rls-redis-lease gateway-redis-lease" "rls-redis-tonic gateway-redis"; do
    read -r rls gateway <<<"$pair"
    [ -n "${per_cpu[$rls]:-}" ] && [ -n "${per_cpu[$gateway]:-}" ] || continue
    echo "| $rls ≥ 0.9 × $gateway | $(awk -v a="${per_cpu[$rls]}" -v b="${per_cpu[$gateway]}" 'BEGIN { printf "%.2f", b ? a / b : 0 }') |"
done
