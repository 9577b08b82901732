#!/usr/bin/env bash
# One command for a local cluster: a 3-primary Redis Cluster and 3 gateway
# nodes on loopback, all sharing one set of windows. Ctrl-C (or SIGTERM)
# stops every process it started and removes its temp dir.
#
#   bash examples/cluster/run.sh
#
# Environment (all optional):
#   GATEWAY        gateway binary (default: build it with cargo --release,
#                  into CARGO_TARGET_DIR when that is set)
#   REDIS_PORTS    three Redis ports            (default "7001 7002 7003")
#   BUS_PORTS      their cluster-bus ports      (default: each Redis port + 10000)
#   GATEWAY_PORTS  three gateway ports          (default "3001 3002 3003")
#   TENANTS        tenants file (default examples/tenants.toml; passed as
#                  --tenants when the file exists and the gateway has the flag,
#                  else the gateway's --limit applies: LIMIT, default 10/1m)
#   GATEWAY_ARGS   extra gateway flags, e.g. "--debug-headers"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

read -r -a redis_ports <<<"${REDIS_PORTS:-7001 7002 7003}"
read -r -a gateway_ports <<<"${GATEWAY_PORTS:-3001 3002 3003}"
if [ -n "${BUS_PORTS:-}" ]; then
    read -r -a bus_ports <<<"$BUS_PORTS"
else
    bus_ports=()
    for p in "${redis_ports[@]}"; do bus_ports+=($((p + 10000))); done
fi
if [ "${#redis_ports[@]}" -ne 3 ] || [ "${#bus_ports[@]}" -ne 3 ] || [ "${#gateway_ports[@]}" -ne 3 ]; then
    echo "run.sh: REDIS_PORTS, BUS_PORTS and GATEWAY_PORTS take three ports each" >&2
    exit 2
fi

for tool in redis-server redis-cli curl; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "run.sh: $tool not found (Debian: apt-get install -y redis-server curl)" >&2
        exit 1
    fi
done

gateway="${GATEWAY:-}"
if [ -z "$gateway" ]; then
    # Where cargo puts it: CARGO_TARGET_DIR when set (a relative one from
    # the directory run.sh was started in, as cargo itself reads it), else
    # the workspace's target/.
    target="${CARGO_TARGET_DIR:-$root/target}"
    case "$target" in
        /*) ;;
        *) target="$PWD/$target" ;;
    esac
    echo "run.sh: building the gateway (cargo build --release) into $target..." >&2
    (cd "$root" && CARGO_TARGET_DIR="$target" cargo build --release --quiet -p tower-window-examples --bin gateway)
    gateway="$target/release/gateway"
fi

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
for p in "${redis_ports[@]}" "${bus_ports[@]}" "${gateway_ports[@]}"; do
    if ! port_free "$p"; then
        echo "run.sh: port $p on 127.0.0.1 is in use; pick others with REDIS_PORTS / BUS_PORTS / GATEWAY_PORTS" >&2
        exit 1
    fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/tower-window-cluster.XXXXXX")"
pids=()
sleeper=""
stopping=0
stop_all() {
    [ "$stopping" -eq 1 ] && return
    stopping=1
    trap - INT TERM EXIT
    # A closed stdout/stderr (e.g. `run.sh | tee` after Ctrl-C) must not stop
    # the cleanup: no SIGPIPE, and messages only after it, never fatal.
    trap '' PIPE
    [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
    if [ "${#pids[@]}" -gt 0 ]; then
        kill -TERM "${pids[@]}" 2>/dev/null || true
        # Gateways stop gracefully; give everything 5 s, then SIGKILL.
        for _ in $(seq 50); do
            alive=0
            for pid in "${pids[@]}"; do
                kill -0 "$pid" 2>/dev/null && alive=1
            done
            [ "$alive" -eq 0 ] && break
            sleep 0.1
        done
        kill -KILL "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
    rm -rf "$work"
    echo "run.sh: stopped ${#pids[@]} processes" >&2 || true
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

# Redis Cluster: three primaries, no replicas.
for i in 0 1 2; do
    dir="$work/redis-${redis_ports[$i]}"
    mkdir -p "$dir"
    redis-server --port "${redis_ports[$i]}" --cluster-port "${bus_ports[$i]}" \
        --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout 2000 --save "" --appendonly no --daemonize no \
        --dir "$dir" --logfile redis.log >/dev/null 2>&1 &
    pids+=($!)
done
for p in "${redis_ports[@]}"; do
    for _ in $(seq 100); do
        redis-cli -p "$p" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    redis-cli -p "$p" ping >/dev/null
done
redis-cli --cluster create "${redis_ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes \
    >"$work/cluster-create.log" 2>&1 || {
    cat "$work/cluster-create.log" >&2
    exit 1
}
for p in "${redis_ports[@]}"; do
    for _ in $(seq 100); do
        redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' && break
        sleep 0.1
    done
    redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' || {
        echo "run.sh: the Redis Cluster did not become ready" >&2
        exit 1
    }
done
seeds="$(printf 'redis://127.0.0.1:%s,' "${redis_ports[@]}")"
seeds="${seeds%,}"

# Gateways: one policy source for all three.
tenants="${TENANTS:-$root/examples/tenants.toml}"
policy_args=()
if [ -f "$tenants" ] && "$gateway" --help 2>/dev/null | grep -q -- '--tenants'; then
    policy_args=(--tenants "$tenants")
    policy_note="tenants from $tenants"
else
    policy_args=(--limit "${LIMIT:-10/1m}")
    policy_note="--limit ${LIMIT:-10/1m} per tenant and user (no --tenants: file missing or gateway without the flag)"
fi
read -r -a extra_args <<<"${GATEWAY_ARGS:-}"
for p in "${gateway_ports[@]}"; do
    "$gateway" --listen "127.0.0.1:$p" --redis-cluster "$seeds" --expected-nodes 3 \
        "${policy_args[@]}" "${extra_args[@]}" >"$work/gateway-$p.log" 2>&1 &
    pids+=($!)
done
for p in "${gateway_ports[@]}"; do
    for _ in $(seq 200); do
        curl -fs "http://127.0.0.1:$p/healthz" >/dev/null 2>&1 && break
        sleep 0.1
    done
    curl -fs "http://127.0.0.1:$p/healthz" >/dev/null || {
        echo "run.sh: gateway on port $p did not start:" >&2
        cat "$work/gateway-$p.log" >&2
        exit 1
    }
done

echo "redis cluster: ${redis_ports[*]/#/127.0.0.1:}"
echo "gateways:      ${gateway_ports[*]/#/http://127.0.0.1:}"
echo "policy:        $policy_note"
echo "demo page:     http://127.0.0.1:${gateway_ports[0]}/?nodes=$(printf 'http://127.0.0.1:%s,' "${gateway_ports[@]}" | sed 's/,$//')"
echo "pids:          ${pids[*]}"
echo "logs:          $work"
echo "ready; Ctrl-C stops everything"

# Wait until a signal (the traps stop everything) or a process dies.
while true; do
    for pid in "${pids[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "run.sh: process $pid exited; stopping the rest" >&2
            exit 1
        fi
    done
    sleep 1 &
    sleeper=$!
    wait "$sleeper" || true
    sleeper=""
done
