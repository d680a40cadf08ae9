#!/bin/bash
# Alternates `huddle bench tasks` runs with and without extra flags, run by run, so the
# two sides of each pair see the same machine state (docs/benchmarks.md).
#
# usage: scripts/bench-alternate.sh HUDDLE_BINARY DB_URL ROUNDS RELAYS [FLAGS...]
#   DB_URL: a Postgres server URL ending in a database the bench may create scratch
#   databases beside (e.g. $HUDDLE_TEST_DATABASE_URL of scripts/pg-test-cluster.sh).
#   FLAGS: what the second run of each pair adds (e.g. --compact-turns).
set -euo pipefail
bin=$1 db=$2 rounds=$3 relays=$4
shift 4
for r in $(seq 1 "$rounds"); do
  for side in base flags; do
    extra=()
    [ "$side" = flags ] && extra=("$@")
    echo "== round $r, $relays relays, ${side}: ${extra[*]:-}"
    "$bin" --db "$db" bench tasks --tasks 10000 --agents 16 --relays "$relays" --turn-ms 1 \
      --lease-ahead --lease-depth 8 "${extra[@]}" 2>/dev/null | grep -E "\| (huddle|plain SQL) \|"
  done
done
