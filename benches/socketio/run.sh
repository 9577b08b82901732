#!/usr/bin/env bash
# Issue 24: the gateway's rooms against Socket.IO 4 with its Redis Streams
# adapter, side by side, in one run (see benches/README.md, "Issue 24: rooms
# against Socket.IO").
#
#   bash benches/socketio/run.sh [client.js options]
#   e.g. bash benches/socketio/run.sh --rounds 3 --messages 20000 --latency-messages 5000
#
# Starts one redis-server on a random loopback port, two gateway nodes (the
# examples' `gateway` binary, --release, rooms on that Redis) and two
# Socket.IO nodes (server.js, on the same Redis), then runs client.js
# against both systems and prints the tables. Everything it starts is
# stopped on exit. A benchmark, not a test: nothing here is timed against
# a threshold; the client fails (exit 1) if a message is lost, repeated or
# reordered on any socket, or a phase is not done within its time bound.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "run.sh: '$1' not found: $2" >&2
    exit 1
  }
}
need node "install Node.js 18 or later (Debian: apt-get install nodejs)"
need npm "install npm (Debian: apt-get install npm)"
need redis-server "install Redis 7 (Debian: apt-get install redis-server)"
need cargo "install the Rust toolchain (the gateway is built with cargo)"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 18 ]; then
  echo "run.sh: node $(node --version) is too old: socket.io 4 and this client need node 18 or later" >&2
  exit 1
fi

# The Node packages, exactly as locked.
if [ ! -d "$here/node_modules" ] || [ "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The gateway, release build (GATEWAY_BIN to use another build).
if [ -z "${GATEWAY_BIN:-}" ]; then
  (cd "$root" && cargo build --release --locked -q -p tower-window-examples --bin gateway)
  GATEWAY_BIN="$(cd "$root" && cargo metadata --format-version 1 --no-deps |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).target_directory))')/release/gateway"
fi
[ -x "$GATEWAY_BIN" ] || {
  echo "run.sh: no gateway binary at $GATEWAY_BIN" >&2
  exit 1
}

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# A free loopback port below 55535 (the tests' range), picked at random.
taken=" "
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 35000))
    case "$taken" in *" $port "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      taken="$taken$port "
      echo "$port"
      return
    fi
  done
  echo "run.sh: no free loopback port found" >&2
  exit 1
}

wait_port() { # port name log
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return; fi
    sleep 0.05
  done
  echo "run.sh: $2 did not listen on 127.0.0.1:$1 within 10 s; its log:" >&2
  cat "$3" >&2
  exit 1
}

redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
redis_pid=$!
wait_port "$redis_port" redis-server "$work/redis.log"
redis_url="redis://127.0.0.1:$redis_port"

# One thread per node on both sides by default: a Socket.IO node runs its
# sockets on one thread (Node's event loop), so the gateway nodes get one
# Tokio worker each; on a shared machine more threads would also take a
# larger share of the cores from the other processes. GATEWAY_THREADS=N
# to change it.
gateway_threads="${GATEWAY_THREADS:-1}"
# GATEWAY_ARGS: more flags for both gateway nodes (e.g. "--rooms-read tail").
read -r -a gateway_args <<<"${GATEWAY_ARGS:-}"
gateway_urls=()
gateway_pids=()
for node in a b; do
  port="$(free_port)"
  # Upgrades are limited per user by --limit: high enough never to refuse
  # one of the run's sockets. No message limits (the default).
  TOKIO_WORKER_THREADS="$gateway_threads" "$GATEWAY_BIN" --listen "127.0.0.1:$port" --redis-url "$redis_url" \
    --limit 100000000/1m --redis-timeout-ms 5000 ${gateway_args[@]+"${gateway_args[@]}"} >"$work/gateway-$node.log" 2>&1 &
  pids+=($!)
  gateway_pids+=($!)
  wait_port "$port" "gateway $node" "$work/gateway-$node.log"
  gateway_urls+=("ws://127.0.0.1:$port")
done

socketio_urls=()
socketio_pids=()
for node in a b; do
  port="$(free_port)"
  node "$here/server.js" "$port" "$redis_url" >"$work/socketio-$node.log" 2>&1 &
  pids+=($!)
  socketio_pids+=($!)
  wait_port "$port" "socket.io $node" "$work/socketio-$node.log"
  socketio_urls+=("http://127.0.0.1:$port")
done

echo "node $(node --version); $(redis-server --version | cut -d' ' -f1-3);" \
  "$(cd "$here" && node -p '["socket.io","@socket.io/redis-streams-adapter","redis","socket.io-client","ws"].map(p=>p+" "+require(p+"/package.json").version).join(", ")');" \
  "gateway nodes with $gateway_threads Tokio worker thread(s) each; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
node "$here/client.js" \
  --gateway "$(IFS=,; echo "${gateway_urls[*]}")" \
  --socketio "$(IFS=,; echo "${socketio_urls[*]}")" \
  --redis "$redis_url" \
  --pids "gateway=$(IFS=,; echo "${gateway_pids[*]}");socketio=$(IFS=,; echo "${socketio_pids[*]}");redis=$redis_pid" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
