#!/usr/bin/env bash
# Load benchmark of tower-window against no limiter and tower_governor.
#
#   bash benches/load/run.sh
#
# Builds `bench_server` (release), spawns its own redis-server on a random
# loopback port (never the system 6379), then for each variant starts the
# server on 127.0.0.1, warms it up, loads it with wrk for a fixed duration and
# concurrency, stops it, and finally prints one Markdown table with the
# targets. Every process it starts is killed on exit (trap).
#
# Settings (environment): DURATION (s, default 10), CONNECTIONS (64),
# THREADS (wrk threads, 2), USERS (distinct x-user-id values, 10000),
# WARMUP (s, 2), WORKERS (server tokio workers, 2), ROUNDS (3),
# VARIANTS (default "none memory governor memory-gcra redis redis-down
# local-flood"; memory-gcra is (b) with tower_governor's algorithm, GCRA;
# memory-open[-ALGORITHM] is (b) with a limit it never reaches, sliding
# counter unless named, and governor-open tower_governor likewise;
# gateway, gateway-sliding-log, gateway-fixed-window and gateway-gcra run the
# examples' `gateway` binary itself on the embedded store, metrics and
# headers on, `--limit 1000000000/1s` (admits everything; governor-open is
# tower_governor admitting everything too) with the sliding
# counter or the named algorithm, loaded at /api/hello; gateway-redis and
# gateway-redis-lease run it on the script's redis-server, the latter with
# `--lease $LEASE` (default 100), optionally followed by -ALGORITHM;
# gateway-redis-audit runs it there with the audit trail on (`--audit
# --audit-sample-admissions $AUDIT_SAMPLE`, default 100);
# gateway-unlimited runs it with every tenant unlimited, the same route with
# no check), LIMIT (the gateway variants' --limit, default
# 1000000000/1s), LUA (the wrk script,
# default users.lua; rotate.lua cycles through the users in turn).
# gateway_table.sh runs the issue's table (one hot user, 10 000 rotating
# users) with this script.
# The variants run in turn, ROUNDS times over (so that a burst of other load
# on the machine hits all of them alike); the table shows each variant's
# median round by requests/s, and every round's requests/s.
# Needs: cargo, redis-server, redis-cli, wrk (installed with apt-get when root).
set -euo pipefail

DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
USERS=${USERS:-10000}
WARMUP=${WARMUP:-2}
WORKERS=${WORKERS:-2}
ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-"none memory governor memory-gcra redis redis-down local-flood"}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
lua=${LUA:-$here/users.lua}
case $lua in /*) ;; */*) lua=$PWD/$lua ;; *) lua=$here/$lua ;; esac
[ -f "$lua" ] || { echo "run.sh: no wrk script $lua" >&2; exit 1; }

die() { echo "run.sh: $*" >&2; exit 1; }

if ! command -v wrk >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing wrk (apt-get)" >&2
        apt-get install -y wrk >/dev/null 2>&1 ||
            { apt-get update >/dev/null 2>&1 && apt-get install -y wrk >/dev/null 2>&1; } ||
            die "could not install wrk with apt-get"
    else
        die "wrk not found; install it (e.g. 'apt-get install wrk') and rerun"
    fi
fi
command -v redis-server >/dev/null || die "redis-server not found (e.g. 'apt-get install redis-server')"
command -v redis-cli >/dev/null || die "redis-cli not found (e.g. 'apt-get install redis-tools')"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tw-load.XXXXXX")
pids=()
# Ends process $1 (TERM, then KILL after 5 s) and reaps it.
end_process() {
    local pid=$1 i
    kill "$pid" 2>/dev/null || return 0
    for i in $(seq 50); do
        # Gone, or a zombie waiting to be reaped.
        case $(ps -o stat= -p "$pid" 2>/dev/null) in "" | Z*) break ;; esac
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        end_process "$pid"
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
# Stops a process this script started and forgets its pid.
stop() {
    local pid=$1 kept=() p
    end_process "$pid"
    for p in "${pids[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
    pids=("${kept[@]}")
}
trap 'exit 130' INT TERM

echo "building bench_server (release)" >&2
(cd "$root" && cargo build --release --quiet -p tower-window-benches --bin bench_server) ||
    die "build failed"
target_dir=${CARGO_TARGET_DIR:-$root/target}
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
server="$target_dir/release/bench_server"
[ -x "$server" ] || die "no binary at $server"
gateway=
case " $VARIANTS " in
*" gateway"*)
    echo "building gateway (release)" >&2
    (cd "$root" && cargo build --release --quiet -p tower-window-examples --bin gateway) ||
        die "gateway build failed"
    gateway="$target_dir/release/gateway"
    ;;
esac

# Our own redis-server on a random loopback port below 55535.
redis_port=
for _ in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 35000))
    [ "$port" = 6379 ] && continue
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
        --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 50); do
        if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
            redis_port=$port
            break 2
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    stop "$pid"
done
[ -n "$redis_port" ] || die "could not start redis-server (see $tmp/redis.log)"
redis_url="redis://127.0.0.1:$redis_port"
echo "redis-server on 127.0.0.1:$redis_port" >&2

# Starts the server for variant $1; sets $server_pid and $server_addr.
start_server() {
    local variant=$1 log="$tmp/server-$1.log" args
    # Emptied here, not only by the server's redirection: that happens in
    # the child, which the address poll below may outrun, reading the
    # previous round's address.
    : >"$log"
    case $variant in
    gateway*)
        # gateway[-redis|-redis-lease][-ALGORITHM]: on the embedded store, on
        # our redis-server, or on it with `--lease $LEASE` (default 100).
        local algorithm=${variant#gateway} store=()
        algorithm=${algorithm#-}
        case $algorithm in
        redis-lease*) store=(--redis-url "$redis_url" --lease "${LEASE:-100}"); algorithm=${algorithm#redis-lease} ;;
        redis-audit*)
            # The audit trail on: denials, degraded decisions, shadow
            # denials, and 1 admission in $AUDIT_SAMPLE (default 100).
            store=(--redis-url "$redis_url" --audit --audit-sample-admissions "${AUDIT_SAMPLE:-100}")
            algorithm=${algorithm#redis-audit} ;;
        redis*) store=(--redis-url "$redis_url"); algorithm=${algorithm#redis} ;;
        unlimited)
            # The same binary and route with every tenant unlimited: the
            # layer resolves the tenant and lets the request through
            # unchecked, so this row is the gateway without rate limiting.
            printf '[default]\nunlimited = true\n' >"$tmp/unlimited.toml"
            store=(--tenants "$tmp/unlimited.toml"); algorithm= ;;
        esac
        algorithm=${algorithm#-}
        # The gateway logs `listening address=ADDR`; its runtime has one
        # worker per CPU, like bench_server's $WORKERS on this machine.
        TOKIO_WORKER_THREADS=$WORKERS RUST_LOG=info "$gateway" --listen 127.0.0.1:0 \
            --limit "${LIMIT:-1000000000/1s}" --algorithm "${algorithm:-sliding-counter}" "${store[@]}" >"$log" 2>&1 &
        server_pid=$!
        pids+=("$server_pid")
        server_addr=
        for _ in $(seq 300); do
            server_addr=$(sed -n 's/.*listening address=\([0-9.:]*\).*/\1/p' "$log" | head -1)
            [ -n "$server_addr" ] && { server_path=/api/hello; return 0; }
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.05
        done
        cat "$log" >&2
        die "gateway ($variant) did not start"
        ;;
    # tower-window with tower_governor's algorithm (GCRA, same rate and burst).
    memory-gcra) args=(--variant memory --quota "1000/1s gcra") ;;
    # (b) with a limit it never reaches, like the gateway's and
    # governor-open's: memory-open is the sliding counter (the gateway's
    # default), memory-open-ALGORITHM another algorithm.
    memory-open*)
        local algorithm=${variant#memory-open}
        algorithm=${algorithm#-}
        args=(--variant memory --quota "1000000000/1s ${algorithm:-sliding-counter}")
        ;;
    # tower_governor with a limit it never reaches (one token a microsecond,
    # bursts of a million): the gateway variants' "admits everything".
    governor-open) args=(--variant governor --governor-period-us 1 --governor-burst 1000000) ;;
    *) args=(--variant "$variant") ;;
    esac
    "$server" "${args[@]}" --workers "$WORKERS" --redis-url "$redis_url" \
        >"$log" 2>&1 &
    server_pid=$!
    pids+=("$server_pid")
    server_addr=
    for _ in $(seq 300); do
        server_addr=$(sed -n 's/^listening on //p' "$log")
        [ -n "$server_addr" ] && { server_path=/; return 0; }
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.05
    done
    cat "$log" >&2
    die "bench_server --variant $variant did not start"
}

stop_server() {
    stop "$server_pid"
}

# Script calls (FCALL, EVALSHA, EVAL) our redis-server ran so far (issue
# 24: script calls per admission).
script_calls() {
    redis-cli -h 127.0.0.1 -p "$redis_port" INFO commandstats 2>/dev/null |
        awk -F'[=,:]' '/^cmdstat_(eval(sha)?|fcall):/ { n += $3 } END { print n + 0 }'
}

# CPU ticks (user + system) used so far by process $1.
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# wrk against $server_addr for $1 seconds with $2 users; prints the RESULT line.
load() {
    local seconds=$1 users=$2
    WRK_USERS=$users WRK_THREADS=$THREADS timeout $((seconds + 30)) \
        wrk -t "$THREADS" -c "$CONNECTIONS" -d "${seconds}s" --timeout 2s \
        -s "$lua" "http://$server_addr$server_path" | sed -n 's/^RESULT //p'
}

declare -A result rounds
for round in $(seq "$ROUNDS"); do
    for variant in $VARIANTS; do
        users=$USERS
        [ "$variant" = local-flood ] && users=1
        echo "round $round/$ROUNDS, variant $variant: warm-up ${WARMUP}s, then ${DURATION}s, $CONNECTIONS connections, $THREADS wrk threads, $users users" >&2
        start_server "$variant"
        [ "$WARMUP" -gt 0 ] && load "$WARMUP" "$users" >/dev/null
        cpu_before=$(cpu_ticks "$server_pid")
        calls_before=$(script_calls)
        line=$(load "$DURATION" "$users")
        cpu_after=$(cpu_ticks "$server_pid")
        calls=$(($(script_calls) - calls_before))
        stop_server
        # Server CPU time (user + system) per request, in µs: less sensitive
        # to other load on the machine than requests/s.
        line="$line $(awk -v t=$((cpu_after - cpu_before)) -v hz="$(getconf CLK_TCK)" -v l="$line" -v c="$calls" \
            'BEGIN { split(l, kv, /[ =]/); n = 0; ok = 0; for (i = 1; i in kv; i += 2) { if (kv[i] == "s2xx" || kv[i] == "s429" || kv[i] == "other") n += kv[i + 1]; if (kv[i] == "s2xx") ok = kv[i + 1] }
                     printf "cpu_us=%.1f calls_per_2xx=%.3f", n ? t / hz * 1e6 / n : 0, ok ? c / ok : 0 }')"
        [ -n "$line" ] || die "wrk printed no result for $variant"
        result[$variant,$round]=$line
        echo "  $line" >&2
    done
done

# The median round of each variant by requests/s.
for variant in $VARIANTS; do
    all=()
    for round in $(seq "$ROUNDS"); do
        rps=${result[$variant,$round]#rps=}
        all+=("${rps%% *} $round")
    done
    median=$(printf '%s\n' "${all[@]}" | sort -n | sed -n "$(((ROUNDS + 1) / 2))p")
    result[$variant]=${result[$variant,${median#* }]}
    rounds[$variant]=$(printf '%s\n' "${all[@]}" | cut -d' ' -f1 | paste -sd' ')
done

field() { # field <variant> <name>
    local kv
    for kv in ${result[$1]:-}; do
        [ "${kv%%=*}" = "$2" ] && { echo "${kv#*=}"; return; }
    done
    echo ""
}

letter() {
    case $1 in
    none) echo "(a) no limiter" ;;
    memory) echo "(b) tower-window, MemoryStore" ;;
    governor) echo "(c) tower_governor 0.8" ;;
    governor-open) echo "(c') tower_governor 0.8, admits everything" ;;
    memory-gcra) echo "(b') tower-window, MemoryStore, GCRA like (c)" ;;
    redis) echo "(d) tower-window, Redis" ;;
    redis-down) echo "(e) tower-window, Redis down, breaker open" ;;
    local-flood) echo "(f) tower-window, one over-limit user, local tier" ;;
    gateway) echo "(g) gateway binary, sliding counter" ;;
    memory-open) echo "(b'') tower-window, MemoryStore, sliding counter, admits everything" ;;
    memory-open-*) echo "(b'') tower-window, MemoryStore, ${1#memory-open-}, admits everything" ;;
    gateway-unlimited) echo "(a') gateway binary, every tenant unlimited (no check)" ;;
    gateway-redis-lease*) echo "(h) gateway binary, Redis, --lease ${LEASE:-100}${1#gateway-redis-lease}" ;;
    gateway-redis-audit*) echo "(h') gateway binary, Redis, --audit --audit-sample-admissions ${AUDIT_SAMPLE:-100}${1#gateway-redis-audit}" ;;
    gateway-redis*) echo "(h) gateway binary, Redis${1#gateway-redis}" ;;
    gateway-*) echo "(g) gateway binary, ${1#gateway-}" ;;
    *) echo "$1" ;;
    esac
}

ms() { awk -v us="$1" 'BEGIN { printf "%.2f", us / 1000 }'; }

echo
echo "wrk -t $THREADS -c $CONNECTIONS -d ${DURATION}s (after ${WARMUP}s warm-up), $(basename "$lua"), $USERS users, $ROUNDS rounds (median shown), $WORKERS server workers, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| variant | requests/s | p50 ms | p99 ms | 2xx | 429 | other | socket errors | server CPU µs/req | Redis script calls per 2xx | req/s of each round |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for variant in $VARIANTS; do
    echo "| $(letter "$variant") | $(field "$variant" rps) | $(ms "$(field "$variant" p50_us)") | $(ms "$(field "$variant" p99_us)") | $(field "$variant" s2xx) | $(field "$variant" s429) | $(field "$variant" other) | $(field "$variant" errors) | $(field "$variant" cpu_us) | $(field "$variant" calls_per_2xx) | ${rounds[$variant]} |"
done

ratio() { # ratio <num variant> <den variant>
    local n d
    n=$(field "$1" rps)
    d=$(field "$2" rps)
    if [ -z "$n" ] || [ -z "$d" ] || [ "$d" = 0 ]; then echo ""; return; fi
    awk -v n="$n" -v d="$d" 'BEGIN { printf "%.2f", n / d }'
}
check() { # check <label> <ratio> <awk condition on r>
    local verdict
    if [ -z "$2" ]; then
        verdict="not measured"
    elif awk -v r="$2" "BEGIN { exit !($3) }"; then
        verdict="met"
    else
        verdict="MISSED"
    fi
    echo "| $1 | ${2:--} | $verdict |"
}

echo
echo "| target | ratio | verdict |"
echo "|---|---:|---|"
check "(b) ≥ 0.9 × (a)" "$(ratio memory none)" "r >= 0.9"
check "(b) ≥ 1.0 × (c)" "$(ratio memory governor)" "r >= 1.0"
check "(f) ≥ (b)" "$(ratio local-flood memory)" "r >= 1.0"
check "(e) within 10% of (b)" "$(ratio redis-down memory)" "r >= 0.9 && r <= 1.1"
for variant in $VARIANTS; do
    case $variant in gateway-redis-lease*) ;; *) continue ;; esac
    # Issue 24 (was 0.8 in issue 14): leases bring the gateway on Redis
    # to the embedded store's speed, never below the unleased gateway on
    # Redis, with few script calls per admission.
    embedded=gateway${variant#gateway-redis-lease}
    check "$variant ≥ 0.9 × $embedded" "$(ratio "$variant" "$embedded")" "r >= 0.9"
    unleased=gateway-redis${variant#gateway-redis-lease}
    check "$variant ≥ 1.0 × $unleased" "$(ratio "$variant" "$unleased")" "r >= 1.0"
    check "$variant script calls per 2xx ≤ 0.05" "$(field "$variant" calls_per_2xx)" "r <= 0.05"
done
for variant in $VARIANTS; do
    # The library alone, like for like: the same bench_server route with
    # tower-window or tower_governor, neither of them denying.
    case $variant in memory-open*) ;; *) continue ;; esac
    check "$variant ≥ 0.9 × (a)" "$(ratio "$variant" none)" "r >= 0.9"
    check "$variant ≥ 1.0 × (c')" "$(ratio "$variant" governor-open)" "r >= 1.0"
done
for variant in $VARIANTS; do
    case $variant in gateway-redis* | gateway-unlimited) continue ;; gateway*) ;; *) continue ;; esac
    check "$variant ≥ 0.9 × (a)" "$(ratio "$variant" none)" "r >= 0.9"
    case " $VARIANTS " in
    *" gateway-unlimited "*) check "$variant ≥ 0.9 × (a')" "$(ratio "$variant" gateway-unlimited)" "r >= 0.9" ;;
    esac
    case " $VARIANTS " in
    *" governor-open "*) check "$variant ≥ 1.0 × (c')" "$(ratio "$variant" governor-open)" "r >= 1.0" ;;
    *) check "$variant ≥ 1.0 × (c)" "$(ratio "$variant" governor)" "r >= 1.0" ;;
    esac
done
