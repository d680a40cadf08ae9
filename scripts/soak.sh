#!/bin/sh
# Soak: the fault battery at scale (plan 0015). Three relays of recording exec agents
# work >= 10,000 tasks and answer >= 1,000 addressed messages while faults are
# injected all the time; at the end the history checker prints its report and the
# figures line (faults by kind, duplicates, losses, re-executions, failover time).
#
#   scripts/soak.sh                 both backends
#   scripts/soak.sh sqlite          one backend (sqlite | postgres)
#   HUDDLE_FAULT_SEED=N scripts/soak.sh   replay a schedule (the seed is printed)
#
# Postgres needs initdb/pg_ctl on the machine (the test runs its own cluster, which
# it restarts). Expect tens of minutes per backend.
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
    | grep --line-buffered -E '^(fault|settled|NOT settled|history report|  |figures:|test |thread )' \
    || true
  grep -q '^test result: ok' "$log" || status=1
done
exit $status
