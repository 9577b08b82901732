#!/usr/bin/env bash
# Instructions per decision of the rls and of the gateway's HTTP path, under
# callgrind, on one redis-server of this script's own (issue 25: the rls's
# per-call cost against the gateway's, without the noise of wall clocks).
#
#   bash benches/load/rls_profile.sh
#   VARIANTS="rls-redis-lease" RLS=/tmp/rls-base bash benches/load/rls_profile.sh
#
# Each variant: the server (release build, or $RLS / $GATEWAY: binaries
# copied aside) starts under `valgrind --tool=callgrind`, is warmed up, its
# counters are zeroed, it gets a fixed load, the counters are dumped, and
# the whole process's instructions (every thread) are divided by the
# decisions answered. Same settings as rls_table.sh: one hot key, a limit
# never reached (1000000000/1s), the sliding counter, metrics on, 32
# requests in flight (rls_load: 4 HTTP/2 connections x 8 calls; wrk: 32
# HTTP/1.1 connections), --lease $LEASE for the *-lease variants; the Redis
# time budget is 2 s (a server under valgrind is some 50x slower, and the
# fallback must not answer instead of Redis). The profiles stay in $OUT for
# `callgrind_annotate --inclusive=yes`.
#
# Settings (environment): VARIANTS, REQUESTS (rls calls measured, 20000),
# WARMUP_REQUESTS (2000), DURATION (gateway seconds measured, 8), WARMUP
# (gateway seconds, 2), LEASE (100), CLIENT (rls_load's --client: tonic,
# or envoy: HTTP/2 frames as Envoy's gRPC client sends them), OUT. Needs: cargo, valgrind, wrk,
# redis-server. Every process it starts is killed on exit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
VARIANTS=${VARIANTS:-"gateway-redis rls-redis gateway-redis-lease rls-redis-lease"}
REQUESTS=${REQUESTS:-20000}
WARMUP_REQUESTS=${WARMUP_REQUESTS:-2000}
DURATION=${DURATION:-8}
WARMUP=${WARMUP:-2}
LEASE=${LEASE:-100}
CLIENT=${CLIENT:-tonic}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/tw-rls-profile.XXXXXX")}
mkdir -p "$OUT"

die() { echo "rls_profile.sh: $*" >&2; exit 1; }
for tool in valgrind callgrind_control wrk redis-server; do
    command -v "$tool" >/dev/null || die "$tool not found"
done

target_dir=${CARGO_TARGET_DIR:-$root/target}
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
if [ -z "${RLS:-}" ] || [ -z "${GATEWAY:-}" ] || [ -z "${RLS_LOAD:-}" ]; then
    (cd "$root" && cargo build --release --quiet -p tower-window-examples --bin gateway --bin rls \
        -p tower-window-benches --bin rls_load) || die "cargo build failed"
fi
RLS=${RLS:-$target_dir/release/rls}
GATEWAY=${GATEWAY:-$target_dir/release/gateway}
RLS_LOAD=${RLS_LOAD:-$target_dir/release/rls_load}

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# Our own redis-server on a random loopback port below 55535, and the rules.
. "$(dirname "${BASH_SOURCE[0]}")/rls_common.sh"
start_redis "$OUT"
write_rules "$OUT"

for variant in $VARIANTS; do
    log=$OUT/server-$variant.log lease=()
    case $variant in *-lease) lease=(--lease "$LEASE") ;; esac
    case $variant in
    gateway*)
        TOKIO_WORKER_THREADS=2 RUST_LOG=info valgrind --tool=callgrind \
            --callgrind-out-file="$OUT/callgrind.$variant.%p" "$GATEWAY" \
            --listen 127.0.0.1:0 --limit 1000000000/1s --algorithm sliding-counter \
            --redis-url "$redis_url" --redis-timeout-ms 2000 "${lease[@]}" >"$log" 2>&1 &
        pattern='s/.*listening address=\([0-9.:]*\).*/\1/p'
        ;;
    rls*)
        TOKIO_WORKER_THREADS=2 RUST_LOG=info valgrind --tool=callgrind \
            --callgrind-out-file="$OUT/callgrind.$variant.%p" "$RLS" \
            --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --config "$OUT/rules.yaml" \
            --redis-url "$redis_url" --redis-timeout-ms 2000 "${lease[@]}" >"$log" 2>&1 &
        pattern='s/.*serving envoy.service.ratelimit.v3.RateLimitService address=\([0-9.:]*\).*/\1/p'
        ;;
    *) die "unknown variant $variant" ;;
    esac
    server_pid=$!
    pids+=("$server_pid")
    addr=
    for _ in $(seq 600); do
        addr=$(sed -n "$pattern" "$log" | head -1)
        [ -n "$addr" ] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$addr" ] || { cat "$log" >&2; die "$variant did not start"; }

    case $variant in
    gateway*)
        gw_load() {
            WRK_USERS=1 WRK_THREADS=2 timeout $(($1 + 60)) wrk -t 2 -c 32 -d "${1}s" --timeout 10s \
                -s "$here/rotate.lua" "http://$addr/api/hello" | sed -n 's/^RESULT //p'
        }
        gw_load "$WARMUP" >/dev/null
        callgrind_control -z "$server_pid" >/dev/null 2>&1
        result=$(gw_load "$DURATION")
        callgrind_control -d "$server_pid" >/dev/null 2>&1
        ok=$(sed -n 's/.*s2xx=\([0-9]*\).*/\1/p' <<<"$result")
        answered=$(awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                          print v["s2xx"] + v["s429"] + v["other"] }' <<<"$result")
        ;;
    rls*)
        rls_load() {
            timeout 600 "$RLS_LOAD" --target "http://$addr" --connections 4 --concurrency 8 \
                --seconds 600 --warmup 0 --max-requests "$1" --domain bench --key user --client "$CLIENT"
        }
        rls_load "$WARMUP_REQUESTS" >/dev/null
        callgrind_control -z "$server_pid" >/dev/null 2>&1
        result=$(rls_load "$REQUESTS")
        callgrind_control -d "$server_pid" >/dev/null 2>&1
        ok=$(sed -n 's/.*ok=\([0-9]*\).*/\1/p' <<<"$result")
        answered=$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$result")
        ;;
    esac
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    [ "${answered:-0}" -gt 0 ] || die "$variant: no answers ($result)"
    profile=$(ls -t "$OUT"/callgrind."$variant".*.1 2>/dev/null | head -1)
    [ -n "$profile" ] || die "$variant: no dump in $OUT"
    instructions=$(callgrind_annotate "$profile" 2>/dev/null | grep -m1 'PROGRAM TOTALS' | tr -d ',' | awk '{print $1}')
    echo "variant=$variant answered=$answered ok=$ok instructions=$instructions per_decision=$((instructions / answered)) profile=$profile"
done
