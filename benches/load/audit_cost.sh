#!/usr/bin/env bash
# Issue 35's cost of the audit trail: the examples' `gateway` on Redis with
# the audit trail off and on (`--audit --audit-sample-admissions
# $AUDIT_SAMPLE`, default 100: denials, degraded decisions, shadow denials
# and 1 % of admissions), interleaved round by round, under wrk (rotate.lua,
# $USERS users, 32 connections). Prints, per run, requests, denials and the
# gateway's CPU time (user + system, /proc) per request, and the log's
# Redis commands.
#
#   bash benches/load/audit_cost.sh                    # LIMIT=5/1s: most requests denied
#   LIMIT=40/1s bash benches/load/audit_cost.sh        # almost none denied
#   ROUNDS=5 DURATION=9 USERS=1000 bash benches/load/audit_cost.sh
#
# Needs: cargo, redis-server, redis-cli, wrk. Every process it starts is
# killed on exit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
LIMIT=${LIMIT:-5/1s}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-9}
USERS=${USERS:-1000}
AUDIT_SAMPLE=${AUDIT_SAMPLE:-100}
for tool in redis-server redis-cli wrk; do
    command -v "$tool" >/dev/null || { echo "audit_cost.sh: $tool not found" >&2; exit 1; }
done
(cd "$root" && cargo build --release --quiet -p tower-window-examples --bin gateway)
target_dir=${CARGO_TARGET_DIR:-$root/target}
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
gateway=$target_dir/release/gateway

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
redis_port=$((20000 + RANDOM % 35000))
redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no --dir "$tmp" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$redis_port" PING >/dev/null 2>&1 && break; sleep 0.1; done
port=$((20000 + RANDOM % 35000))
hz=$(getconf CLK_TCK)

echo "| round | audit | requests | denied | gateway CPU µs/request |"
echo "|---:|---|---:|---:|---:|"
for round in $(seq "$ROUNDS"); do
    for audit in off on; do
        redis-cli -p "$redis_port" FLUSHALL >/dev/null
        extra=()
        [ "$audit" = on ] && extra=(--audit --audit-sample-admissions "$AUDIT_SAMPLE")
        TOKIO_WORKER_THREADS=2 "$gateway" --listen "127.0.0.1:$port" --limit "$LIMIT" \
            --redis-url "redis://127.0.0.1:$redis_port" "${extra[@]}" >"$tmp/gateway.log" 2>&1 &
        pid=$!
        pids+=("$pid")
        for _ in $(seq 100); do grep -q "listening" "$tmp/gateway.log" && break; sleep 0.05; done
        before=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
        WRK_USERS=$USERS WRK_THREADS=2 timeout $((DURATION + 30)) wrk -t2 -c32 -d"${DURATION}s" \
            -s "$here/rotate.lua" "http://127.0.0.1:$port/api/hello" >"$tmp/wrk.out" 2>&1
        after=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        result=$(sed -n 's/^RESULT //p' "$tmp/wrk.out" | tr ' ' '\n')
        requests=$(awk -F= '$1 == "s2xx" || $1 == "s429" || $1 == "other" { n += $2 } END { print n + 0 }' <<<"$result")
        denied=$(awk -F= '$1 == "s429" { print $2 }' <<<"$result")
        cpu=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$requests" 'BEGIN { printf "%.2f", n ? t / hz * 1e6 / n : 0 }')
        echo "| $round | $audit | $requests | $denied | $cpu |"
    done
done
echo
echo "Redis: $(redis-cli -p "$redis_port" INFO commandstats | grep -E '^cmdstat_(fcall|xadd):' | cut -d, -f1-3 | tr '\n' ' ')"
