#!/usr/bin/env bash
# Issue 10's table in one command: the examples' `gateway` binary (embedded
# store, metrics and headers on, every algorithm) against the same machine's
# bare axum route and tower_governor 0.8 (governor-open: a limit it never
# reaches, as the gateway's), for one hot user and for 10 000
# users taking turns (rotate.lua), wrk with 32 connections.
#
#   bash benches/load/gateway_table.sh
#   DURATION=5 ROUNDS=3 bash benches/load/gateway_table.sh
#
# Every setting of run.sh applies (DURATION, ROUNDS, WARMUP, WORKERS, ...);
# VARIANTS defaults to the bare route, tower_governor and the gateway with
# each algorithm, plus gateway-unlimited (the gateway's own route with every
# tenant unlimited: what the example app costs without any check) and
# memory-open (bench_server's route behind tower-window on the embedded
# store, never denying: the library against governor-open like for like).
# Prints run.sh's tables once per load.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CONNECTIONS=${CONNECTIONS:-32}
export VARIANTS=${VARIANTS:-"none gateway-unlimited governor-open memory-open gateway gateway-sliding-log gateway-fixed-window gateway-gcra"}
export LUA=$here/rotate.lua
for users in 1 10000; do
    echo "## $users user(s), rotate.lua"
    USERS=$users bash "$here/run.sh"
    echo
done
