#!/usr/bin/env bash
# Instructions per request of one load-benchmark variant, under callgrind.
#
#   bash benches/load/profile.sh memory            # any bench_server variant
#   bash benches/load/profile.sh memory --quota "1000/1s gcra"
#
# Wall-clock numbers on a shared 2-vCPU machine move by 10-20 % from run to
# run; instruction counts do not (to about 2 %), so this is how the hot-path
# changes in benches/README.md were compared. It builds `bench_server`
# (release), starts it under `valgrind --tool=callgrind` on a free loopback
# port, warms it up with wrk for WARMUP seconds (every user's state is then
# in place), zeroes the counters, loads it for DURATION seconds with one wrk
# thread and CONNECTIONS connections, dumps the counters, and prints the
# server's instructions per request (all threads; requests counted by
# users.lua). Extra arguments go to `bench_server`. Every process it starts
# is killed on exit. The profile is kept in $OUT (default: a temp dir) for
# `callgrind_annotate --inclusive=yes`.
#
# Settings (environment): DURATION (s, 6), WARMUP (s, 2), CONNECTIONS (8),
# USERS (1000), OUT, SERVER (a bench_server binary to profile instead of
# building one: a base build copied aside, say). Needs: cargo, valgrind (callgrind_control), wrk
# (both installed with apt-get when root). The redis variants need a Redis
# on --redis-url; under valgrind their 50 ms budget may expire, so profile
# them only to compare builds with each other.
set -euo pipefail

variant=${1:?usage: profile.sh VARIANT [bench_server args...]}
shift
DURATION=${DURATION:-6}
WARMUP=${WARMUP:-2}
CONNECTIONS=${CONNECTIONS:-8}
USERS=${USERS:-1000}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
die() { echo "profile.sh: $*" >&2; exit 1; }

for tool in wrk:wrk callgrind_control:valgrind; do
    command -v "${tool%%:*}" >/dev/null && continue
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y "${tool##*:}" >/dev/null 2>&1 ||
            { apt-get update >/dev/null 2>&1 && apt-get install -y "${tool##*:}" >/dev/null 2>&1; } ||
            die "could not install ${tool##*:} with apt-get"
    else
        die "${tool%%:*} not found; install ${tool##*:} and rerun"
    fi
done

if [ -n "${SERVER:-}" ]; then
    server=$SERVER
    [ -x "$server" ] || die "SERVER=$server is not an executable"
else
    echo "building bench_server (release)" >&2
    (cd "$root" && cargo build --release --quiet -p tower-window-benches --bin bench_server) ||
        die "build failed"
    target_dir=${CARGO_TARGET_DIR:-$root/target}
    case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
    server="$target_dir/release/bench_server"
fi

OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/tw-profile.XXXXXX")}
mkdir -p "$OUT"
pid=
cleanup() { [ -z "$pid" ] || { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; }
trap cleanup EXIT
trap 'exit 130' INT TERM

valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out.%p" \
    "$server" --variant "$variant" --addr 127.0.0.1:0 "$@" >"$OUT/server.log" 2>&1 &
pid=$!
# The server prints `listening on ADDR` once it accepts connections.
addr=
for _ in $(seq 300); do
    addr=$(sed -n 's/^listening on //p' "$OUT/server.log" | head -1)
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || die "bench_server exited; see $OUT/server.log"
    sleep 0.2
done
[ -n "$addr" ] || die "bench_server did not start; see $OUT/server.log"

load() {
    WRK_USERS=$USERS wrk -t 1 -c "$CONNECTIONS" -d "${1}s" --timeout 5s \
        -s "$here/users.lua" "http://$addr/" 2>&1 | grep '^RESULT' || true
}
load "$WARMUP" >/dev/null
callgrind_control -z "$pid" >/dev/null 2>&1
result=$(load "$DURATION")
callgrind_control -d "$pid" >/dev/null 2>&1
[ -n "$result" ] || die "wrk printed no result"

requests=$(($(echo "$result" | sed -E 's/.*s2xx=([0-9]+) s429=([0-9]+) other=([0-9]+).*/\1 + \2 + \3/')))
profile=$(ls "$OUT"/callgrind.out.*.1 | head -1)
instructions=$(callgrind_annotate "$profile" | grep -m1 'PROGRAM TOTALS' | tr -d ',' | awk '{print $1}')
[ "$requests" -gt 0 ] || die "no requests were answered"
echo "variant=$variant requests=$requests instructions=$instructions per_request=$((instructions / requests)) profile=$profile"
