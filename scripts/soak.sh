#!/bin/sh
# Soak: the fault battery at scale (plans 0015, 0030). Successive rounds, each a fresh
# database and three fresh relays of recording exec agents working 500 tasks and 50
# addressed messages while faults are injected all the time, until >= 10,000 tasks
# and >= 1,000 messages were worked. Every round's history is checked; at the end the
# figures of all rounds are printed together (faults by kind, duplicates, losses,
# re-executions by cause, late starts refused, failover times).
#
#   scripts/soak.sh                 both backends
#   scripts/soak.sh sqlite          one backend (sqlite | postgres)
#   HUDDLE_FAULT_SEED=N scripts/soak.sh   replay (round i uses seed N+i; printed)
#   HUDDLE_SOAK_TASKS=2000 HUDDLE_SOAK_MESSAGES=200 scripts/soak.sh   a shorter soak
#
# Postgres needs initdb/pg_ctl on the machine (each round runs its own cluster, which
# it restarts). About 20-40 minutes per backend on a 2-core machine.
set -eu
cd "$(dirname "$0")/.."
case "${1:-both}" in
  sqlite) tests="exactly_once_under_faults_sqlite" ;;
  postgres) tests="exactly_once_under_faults_postgres" ;;
  both) tests="exactly_once_under_faults_sqlite exactly_once_under_faults_postgres" ;;
  *) echo "usage: $0 [sqlite|postgres|both]" >&2; exit 2 ;;
esac
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in $tests; do
  echo "== soak: $t"
  HUDDLE_SOAK=1 cargo test -p huddle --test e2e "fault_battery::$t" -- --exact --nocapture 2>&1 \
    | tee "$log" \
    | grep --line-buffered -E '^(fault|soak|settled|NOT settled|history report|  |figures:|test |thread )' \
    || true
  grep -q '^test result: ok' "$log" || status=1
done
exit $status
