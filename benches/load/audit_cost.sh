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
# MODE=instructions counts the gateway's instructions per request instead
# (all its threads, the audit writer's included), under callgrind, which a
# busy 2-core machine does not move: a warm-up of WARMUP seconds (every
# user's window spent, with the default LIMIT=5/1m and USERS=200: the
# measured requests are the local tier's denials), the counters zeroed,
# DURATION seconds of load, a wait until Redis's XADD count stops moving
# (the writer drained), the counters dumped. A 2 s Redis time budget and
# CONNECTIONS=2, so valgrind's slowness never trips the breaker's
# slow-call trigger (25 ms) and turns decisions into fallbacks.
#
#   MODE=instructions bash benches/load/audit_cost.sh                       # every request denied
#   MODE=instructions LIMIT=1000000/1s bash benches/load/audit_cost.sh      # none denied
#
# Needs: cargo, redis-server, redis-cli, wrk (and valgrind for
# MODE=instructions). Every process it starts is killed on exit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
MODE=${MODE:-cpu}
if [ "$MODE" = instructions ]; then
    LIMIT=${LIMIT:-5/1m}
    USERS=${USERS:-200}
    DURATION=${DURATION:-10}
    WARMUP=${WARMUP:-10}
    CONNECTIONS=${CONNECTIONS:-2}
fi
CONNECTIONS=${CONNECTIONS:-32}
LIMIT=${LIMIT:-5/1s}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-9}
USERS=${USERS:-1000}
AUDIT_SAMPLE=${AUDIT_SAMPLE:-100}
tools="redis-server redis-cli wrk"
[ "$MODE" = instructions ] && tools="$tools callgrind_control"
for tool in $tools; do
    command -v "$tool" >/dev/null || { echo "audit_cost.sh: $tool not found" >&2; exit 1; }
done
# GATEWAY: a gateway binary to measure instead of building one (a base
# build copied aside, to compare builds).
if [ -n "${GATEWAY:-}" ]; then
    gateway=$GATEWAY
else
    (cd "$root" && cargo build --release --quiet -p tower-window-examples --bin gateway)
    target_dir=${CARGO_TARGET_DIR:-$root/target}
    case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
    gateway=$target_dir/release/gateway
fi

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

# wrk for $1 seconds; its RESULT line's counts in $tmp/wrk.out.
load() {
    WRK_USERS=$USERS WRK_THREADS=2 timeout $(($1 + 30)) wrk -t2 -c"$CONNECTIONS" -d"$1s" --timeout 5s \
        -s "$here/rotate.lua" "http://127.0.0.1:$port/api/hello" >"$tmp/wrk.out" 2>&1
}
# Waits until Redis's count of XADD calls stops moving (at most 30 s).
drained() {
    local before=-1 now
    for _ in $(seq 60); do
        now=$(redis-cli -p "$redis_port" INFO commandstats | sed -n 's/^cmdstat_xadd:calls=\([0-9]*\),.*/\1/p')
        now=${now:-0}
        [ "$now" = "$before" ] && return
        before=$now
        sleep 0.5
    done
}
# The count of $1 (s2xx, s429, other; all: their sum) in $tmp/wrk.out.
counted() {
    sed -n 's/^RESULT //p' "$tmp/wrk.out" | tr ' ' '\n' |
        awk -F= -v want="$1" '($1 == want) || (want == "all" && ($1 == "s2xx" || $1 == "s429" || $1 == "other")) { n += $2 } END { print n + 0 }'
}

if [ "$MODE" = instructions ]; then
    echo "| round | audit | requests | denied | gateway instructions/request |"
else
    echo "| round | audit | requests | denied | gateway CPU µs/request |"
fi
echo "|---:|---|---:|---:|---:|"
for round in $(seq "$ROUNDS"); do
    for audit in off on; do
        redis-cli -p "$redis_port" FLUSHALL >/dev/null
        extra=()
        [ "$audit" = on ] && extra=(--audit --audit-sample-admissions "$AUDIT_SAMPLE")
        run=("$gateway")
        [ "$MODE" = instructions ] &&
            run=(valgrind --tool=callgrind --callgrind-out-file="$tmp/callgrind.$round.$audit.%p" "$gateway" --redis-timeout-ms 2000)
        TOKIO_WORKER_THREADS=2 "${run[@]}" --listen "127.0.0.1:$port" --limit "$LIMIT" \
            --redis-url "redis://127.0.0.1:$redis_port" "${extra[@]}" >"$tmp/gateway.log" 2>&1 &
        pid=$!
        pids+=("$pid")
        for _ in $(seq 600); do grep -q "listening" "$tmp/gateway.log" && break; sleep 0.05; done
        if [ "$MODE" = instructions ]; then
            load "$WARMUP"
            callgrind_control -z "$pid" >/dev/null 2>&1
            load "$DURATION"
            drained
            callgrind_control -d "$pid" >/dev/null 2>&1
            profile=$(ls "$tmp"/callgrind."$round.$audit".*.1 | head -1)
            spent=$(callgrind_annotate "$profile" | grep -m1 'PROGRAM TOTALS' | tr -d ',' | awk '{ print $1 }')
        else
            before=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
            load "$DURATION"
            after=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
        fi
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        requests=$(counted all)
        denied=$(counted s429)
        if [ "$MODE" = instructions ]; then
            per=$(awk -v t="$spent" -v n="$requests" 'BEGIN { printf "%.0f", n ? t / n : 0 }')
        else
            per=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$requests" 'BEGIN { printf "%.2f", n ? t / hz * 1e6 / n : 0 }')
        fi
        echo "| $round | $audit | $requests | $denied | $per |"
    done
done
echo
echo "Redis: $(redis-cli -p "$redis_port" INFO commandstats | grep -E '^cmdstat_(fcall|xadd):' | cut -d, -f1-3 | tr '\n' ' ')"
