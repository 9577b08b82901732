#!/usr/bin/env bash
# Issue 36's figures under the rls's load: Redis's `usec_per_call` of the
# decision command (`FCALL`, or `EVALSHA`) and Redis CPU per decision, with
# the examples' `rls` (driven by `rls_load`) deciding on one redis-server of
# this script's own, one rule per variant. Prints markdown table rows.
#
#   bash benches/load/redis_cost_rls.sh
#   DURATION=4 ROUNDS=3 MODES="fcall evalsha" bash benches/load/redis_cost_rls.sh
#   VARIANTS="fw-hot fw-10k" MODES=fcall bash benches/load/redis_cost_rls.sh
#   RLS=/tmp/rls-base RLS_LOAD=/tmp/rls_load bash benches/load/redis_cost_rls.sh
#
# Variants (algorithm-spread): fw (fixed window), gcra, sc (sliding counter:
# the rls gives a 1 s window 50 buckets of 20 ms), sl (sliding log), each at
# a limit of 100 per second, as `redis_cost` steps are; three (three
# descriptors of one request, one rule each: fixed window, GCRA, sliding
# counter — or sliding log where the rls has no GCRA — decided in one call);
# lease (fixed window, 1,000,000 per second, never reached, `--lease
# $LEASE`: the decisions come from leases, Redis sees their reservations
# and refunds). -hot: one descriptor value; -10k: $KEYS values in turn. The
# rls runs with `--local-cache-keys 0`, so the hot key's denials reach Redis
# too (its local tier would answer them), and a Redis time budget of
# $REDIS_TIMEOUT_MS ms, so a busy machine measures calls, not fallbacks.
#
# Modes: fcall (the store's default where Redis has functions) and evalsha:
# the store turns functions off for good when the server answers `FCALL`
# with NOPERM, so for evalsha this script denies `FCALL` to the default
# user (`ACL SETUSER default -fcall -fcall_ro`) before the rls starts, and
# allows it again for fcall. Each mode must see only its own command.
#
# Per variant, mode and round: a fresh rls, $WARMUP s of load, `CONFIG
# RESETSTAT`, $DURATION s of load (`rls_load`: 4 HTTP/2 connections x 8
# calls in flight), then `INFO commandstats` and `INFO cpu`. A run fails
# loudly on a load error, a failed or rejected command, a fallback
# decision, or the other mode's command. Variants and modes run
# interleaved, round by round; each cell is the min–max over rounds.
# Needs: cargo, redis-server, redis-cli, curl. Every process it starts is
# killed on exit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
KEYS=${KEYS:-10000}
LEASE=${LEASE:-10}
WORKERS=${WORKERS:-$(nproc)}
REDIS_TIMEOUT_MS=${REDIS_TIMEOUT_MS:-1000}
MODES=${MODES:-"fcall evalsha"}
VARIANTS=${VARIANTS:-"fw-hot gcra-hot sc-hot sl-hot fw-10k gcra-10k sc-10k sl-10k three-hot three-10k lease-hot"}

die() { echo "redis_cost_rls.sh: $*" >&2; exit 1; }
for tool in redis-server redis-cli curl; do
    command -v "$tool" >/dev/null || die "$tool not found"
done

target_dir=${CARGO_TARGET_DIR:-$root/target}
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac
# RLS, RLS_LOAD: binaries copied aside (a base build, say) to run instead.
if [ -z "${RLS:-}" ] || [ -z "${RLS_LOAD:-}" ]; then
    (cd "$root" && cargo build --release --quiet -p tower-window-examples --bin rls \
        -p tower-window-benches --bin rls_load) || die "cargo build failed"
fi
RLS=${RLS:-$target_dir/release/rls}
RLS_LOAD=${RLS_LOAD:-$target_dir/release/rls_load}

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

. "$here/rls_common.sh"
start_redis "$tmp"
rcli() { redis-cli -u "$redis_url" "$@"; }

# One rate_limit line: algorithm $1, limit $2 per second.
limit() { echo "{ unit: second, requests_per_unit: $2, algorithm: $1 }"; }
algorithm() {
    case $1 in
    fw) echo fixed-window ;; gcra) echo gcra ;; sc) echo sliding-counter ;; sl) echo sliding-log ;;
    esac
}

# The rules of variant $1 in $tmp/rules-$1.yaml; sets $keys (rls_load --key).
write_variant_rules() {
    local variant=$1 kind=${1%-*} file=$tmp/rules-$1.yaml
    {
        echo "domain: bench"
        echo "descriptors:"
        case $kind in
        three)
            local i=0
            for a in $THREE; do
                echo "  - key: k$i"
                echo "    rate_limit: $(limit "$(algorithm "$a")" 100)"
                i=$((i + 1))
            done
            ;;
        lease)
            echo "  - key: k0"
            echo "    rate_limit: $(limit fixed-window 1000000)"
            ;;
        *)
            echo "  - key: k0"
            echo "    rate_limit: $(limit "$(algorithm "$kind")" 100)"
            ;;
        esac
    } >"$file"
    case $kind in three) keys=k0,k1,k2 ;; *) keys=k0 ;; esac
}

# Starts the rls on the rules of variant $1; sets $server_pid,
# $server_addr and $metrics_addr. Returns 1 if it exits first (but for a
# metrics port that was taken: then it tries another).
start_rls() {
    local variant=$1 log="$tmp/rls-$1.log" lease=() attempt
    case $variant in lease-*) lease=(--lease "$LEASE") ;; esac
    for attempt in $(seq 10); do
        # The rls logs the metrics address as given: so not port 0.
        metrics_addr=127.0.0.1:$((20000 + RANDOM % 35000))
        TOKIO_WORKER_THREADS=$WORKERS RUST_LOG=info "$RLS" --listen 127.0.0.1:0 \
            --metrics-listen "$metrics_addr" --config "$tmp/rules-$variant.yaml" \
            --redis-url "$redis_url" --redis-timeout-ms "$REDIS_TIMEOUT_MS" \
            --local-cache-keys 0 "${lease[@]}" >"$log" 2>&1 &
        server_pid=$!
        pids+=("$server_pid")
        server_addr=
        for _ in $(seq 300); do
            server_addr=$(sed -n 's/.*serving envoy.service.ratelimit.v3.RateLimitService address=\([0-9.:]*\).*/\1/p' "$log" | head -1)
            [ -n "$server_addr" ] && return 0
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.05
        done
        grep -q -- "--metrics-listen .*cannot listen there" "$log" || break
    done
    kill -0 "$server_pid" 2>/dev/null || return 1
    cat "$log" >&2
    die "$variant: the rls did not start"
}

stop_rls() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
}

# The rls of this tree may know no GCRA (its rules name three algorithms):
# then the gcra variants are left out and `three` takes the sliding log.
THREE="fw gcra sc"
write_variant_rules gcra-hot
if ! start_rls gcra-hot; then
    grep -q "unknown variant" "$tmp/rls-gcra-hot.log" || { cat "$tmp/rls-gcra-hot.log" >&2; die "the rls did not start"; }
    echo "the rls refuses \`algorithm: gcra\`: no gcra variants; three = fixed window + sliding counter + sliding log" >&2
    VARIANTS=$(tr ' ' '\n' <<<"$VARIANTS" | grep -v '^gcra-' | tr '\n' ' ')
    THREE="fw sc sl"
else
    stop_rls
fi

# Load on the running rls for $1 seconds; prints rls_load's line.
load() {
    local keys_flag=1
    case $variant in *-10k) keys_flag=$KEYS ;; esac
    timeout $(($1 + 60)) "$RLS_LOAD" --target "http://$server_addr" --connections 4 \
        --concurrency 8 --seconds "$1" --warmup 0 --domain bench --key "$keys" \
        --keys "$keys_flag" --client envoy
}

cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'; }
# "calls usec_per_call failed rejected" of command $1 (zeros if it never ran).
stats() {
    rcli INFO commandstats | tr -d '\r' | awk -v cmd="cmdstat_$1:" '
        index($0, cmd) == 1 { n = split(substr($0, length(cmd) + 1), f, ",")
            for (i = 1; i <= n; i++) { split(f[i], kv, "="); v[kv[1]] = kv[2] } }
        END { printf "%d %s %d %d", v["calls"], v["usec_per_call"] + 0, v["failed_calls"], v["rejected_calls"] }'
}
fallbacks() {
    curl -sf "http://$metrics_addr/metrics" | awk '/^tower_window_fallback_decisions_total/ { s += $NF } END { print s + 0 }'
}

declare -A cell
for round in $(seq "$ROUNDS"); do
    for variant in $VARIANTS; do
        write_variant_rules "$variant"
        for mode in $MODES; do
            case $mode in
            fcall) other=evalsha acl=(+fcall +fcall_ro) ;;
            evalsha) other=fcall acl=(-fcall -fcall_ro) ;;
            *) die "MODES: fcall or evalsha, not $mode" ;;
            esac
            rcli ACL SETUSER default "${acl[@]}" >/dev/null
            start_rls "$variant" || { cat "$tmp/rls-$variant.log" >&2; die "$variant: the rls exited"; }
            if [ "$WARMUP" -gt 0 ]; then load "$WARMUP" >/dev/null || die "$variant, $mode: the warm-up load failed"; fi
            rcli CONFIG RESETSTAT >/dev/null
            before=$(cpu)
            out=$(load "$DURATION") || die "$variant, $mode: rls_load failed: $out"
            after=$(cpu)
            read -r calls usec failed rejected <<<"$(stats "$mode")"
            read -r other_calls _ <<<"$(stats "$other")"
            fell_back=$(fallbacks) || die "$variant, $mode: no metrics at $metrics_addr"
            # Fallbacks (counted from the rls's start, warm-up included):
            # say why before failing below.
            if [ "$fell_back" -ne 0 ]; then
                curl -sf "http://$metrics_addr/metrics" | grep -E "fallback|store_errors|breaker" >&2 || true
                tail -20 "$tmp/rls-$variant.log" >&2
            fi
            stop_rls
            requests=$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$out")
            ok=$(sed -n 's/.* ok=\([0-9]*\).*/\1/p' <<<"$out")
            errors=$(sed -n 's/.*errors=\([0-9]*\).*/\1/p' <<<"$out")
            what="round $round, $variant, $mode"
            [ -n "$requests" ] && [ "$requests" -gt 0 ] || die "$what: no result: $out"
            [ "$errors" -eq 0 ] || die "$what: $errors load errors: $out"
            [ "$calls" -gt 0 ] || die "$what: no $mode call"
            [ "$failed" -eq 0 ] && [ "$rejected" -eq 0 ] || die "$what: $failed failed, $rejected rejected $mode calls"
            [ "$other_calls" -eq 0 ] || die "$what: $other_calls $other calls"
            [ "$fell_back" -eq 0 ] || die "$what: $fell_back fallback decisions"
            # usec_per_call, CPU µs per decision, calls per decision,
            # decisions per second, admitted share (%).
            cell[$variant,$mode,$round]=$(awk -v u="$usec" -v c="$(awk -v a="$after" -v b="$before" 'BEGIN { print a - b }')" \
                -v n="$requests" -v k="$calls" -v s="$DURATION" -v ok="$ok" \
                'BEGIN { printf "%.2f %.2f %.2f %.0f %.0f", u, c * 1e6 / n, k / n, n / s, 100 * ok / n }')
            echo "$what: usec_per_call cpu_us/decision calls/decision decisions/s admitted% = ${cell[$variant,$mode,$round]}" >&2
        done
    done
done

name() {
    local kind=${1%-*} spread="hot key"
    case $1 in *-10k) spread="$KEYS keys" ;; esac
    case $kind in
    fw) echo "fixed window, $spread" ;;
    gcra) echo "GCRA, $spread" ;;
    sc) echo "sliding counter (50 buckets), $spread" ;;
    sl) echo "sliding log, $spread" ;;
    three) echo "three quotas ($(for a in $THREE; do algorithm "$a"; done | paste -sd+ | sed 's/+/ + /g')), $spread" ;;
    lease) echo "lease (--lease $LEASE), fixed window 1000000/s, $spread" ;;
    esac
}
# min–max over rounds of field $4 (1-based) of variant $1, mode $2.
range() {
    for round in $(seq "$ROUNDS"); do
        cut -d' ' -f"$3" <<<"${cell[$1,$2,$round]}"
    done | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (lo == hi) print lo; else print lo "–" hi }'
}

echo "$ROUNDS rounds of ${DURATION}s (after ${WARMUP}s warm-up), interleaved; rls_load 4 x 8 in flight, --client envoy; rls: $WORKERS workers, --local-cache-keys 0; $(nproc) CPUs; $(redis-server --version | cut -d' ' -f3); $(date -u '+%Y-%m-%d %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
head="| variant (rls rule, limit 100/s)"
sep="|---"
for mode in $MODES; do
    head+=" | $mode \`usec_per_call\` µs | $mode Redis CPU µs / decision | $mode calls / decision | $mode decisions/s"
    sep+="|---:|---:|---:|---:"
done
echo "$head | admitted % |"
echo "$sep|---:|"
for variant in $VARIANTS; do
    row="| $(name "$variant")"
    for mode in $MODES; do
        row+=" | $(range "$variant" "$mode" 1) | $(range "$variant" "$mode" 2) | $(range "$variant" "$mode" 3) | $(range "$variant" "$mode" 4)"
    done
    first=${MODES%% *}
    echo "$row | $(range "$variant" "$first" 5) |"
done
