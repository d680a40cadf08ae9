#!/usr/bin/env bash
# The database floor of a task hand-off, today and with "lots" (plan 0078), beside the
# plain-SQL queue of `huddle bench tasks`: pgbench drives huddle's own Postgres
# functions on a scratch database of the given server (dropped at the end), clients on
# their own connections, no relays (so no reads, no folds: the database side only).
#
#   scripts/lot-floor/run.sh POSTGRES_URL [SECONDS] [CLIENTS]
#
# Needs `pgbench`, `psql` and a release build (`cargo build --release -p huddle-cli`).
# Reports per variant: tasks/s, the machine's busy CPU per task less pgbench's own (the
# server's share: run it where the server runs, on an otherwise idle machine), and
# pgbench's CPU per task.
set -euo pipefail
url=${1:?usage: run.sh POSTGRES_URL [SECONDS] [CLIENTS]}
secs=${2:-10}
clients=${3:-4}
here=$(cd "$(dirname "$0")" && pwd)
huddle=${HUDDLE_BIN:-$here/../../target/release/huddle}
db=floor_$$
base=${url%/*}
scratch=$base/$db
work=$(mktemp -d)
cleanup() {
    psql -q "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

psql -q "$url" -c "CREATE DATABASE $db" >/dev/null
"$huddle" --db "$scratch" migrate >/dev/null
psql -q -v ON_ERROR_STOP=1 "$scratch" -f "$here/functions.sql" >/dev/null
psql -q "$scratch" -c "INSERT INTO floor_jobs (id, dep, state) SELECT g, NULL, 1 FROM generate_series(1, 2000000) g" >/dev/null
psql -q "$scratch" -c "VACUUM ANALYZE" >/dev/null

# Busy CPU of the whole machine, in clock ticks (user + nice + system + irq + softirq):
# the server's CPU is that minus pgbench's own, so run it on a machine otherwise idle.
busy() {
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat
}

script() { # name, tasks per transaction, lot?
    local name=$1 k=$2 lot=$3 f=$work/$1.sql
    {
        echo 'SELECT nextval('"'"'floor_task'"'"') * 64 AS base \gset'
        echo "SELECT floor_handoff(:base, $k, $lot);"
        if [ "$lot" = true ]; then
            echo "SELECT floor_complete(:base, 0, $k, true);"
        else
            for ((j = 0; j < k; j++)); do echo "SELECT floor_complete(:base, $j, 1, false);"; done
        fi
    } > "$f"
    echo "$f"
}
cat > "$work/queue.sql" <<'SQL'
UPDATE floor_jobs SET state = 2 WHERE id = (SELECT id FROM floor_jobs WHERE state = 1 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id \gset
WITH d AS (INSERT INTO floor_done (id, worker) VALUES (:id, :client_id)) UPDATE floor_jobs SET state = CASE WHEN id = :id THEN 3 ELSE 1 END WHERE id = :id OR dep = :id;
SQL

run() { # label, script, tasks per transaction
    local label=$1 f=$2 k=$3 before after out n client
    before=$(busy)
    out=$( { /usr/bin/time -f "client %U %S" pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -f "$f" "$scratch"; } 2>&1) || {
        echo "$out" >&2
        exit 1
    }
    after=$(busy)
    # Nothing left for autovacuum or a timed checkpoint to do inside the next variant.
    psql -q "$scratch" -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
    n=$(echo "$out" | awk '/number of transactions actually processed/ {split($0, a, ": "); split(a[2], b, "/"); print b[1]}')
    client=$(echo "$out" | awk '/^client / { print $2 + $3 }')
    awk -v l="$label" -v n="$n" -v k="$k" -v s="$secs" -v c=$((after - before)) -v t="$(getconf CLK_TCK)" -v cl="$client" \
        'BEGIN { printf "| %s | %d | %.0f | %.3f | %.3f |\n", l, k, n * k / s, (c / t - cl) * 1000 / (n * k), cl * 1000 / (n * k) }'
}

# huddle's sessions plan each statement once (plan 0065); so do these.
export PGOPTIONS="${PGOPTIONS:-} -c plan_cache_mode=force_generic_plan"
# A warm-up of every variant, not reported: the first statements on empty tables would
# otherwise be planned and measured on statistics of nothing.
for k in 1 4 16; do
    pgbench -n -M prepared -c "$clients" -j "$clients" -T 1 -f "$(script today$k "$k" false)" "$scratch" >/dev/null 2>&1
    pgbench -n -M prepared -c "$clients" -j "$clients" -T 1 -f "$(script lot$k "$k" true)" "$scratch" >/dev/null 2>&1
done
pgbench -n -M prepared -c "$clients" -j "$clients" -T 1 -f "$work/queue.sql" "$scratch" >/dev/null 2>&1
psql -q "$scratch" -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null

echo "| variant | tasks per statement | tasks/s | server CPU ms/task | pgbench CPU ms/task |"
echo "|---|---:|---:|---:|---:|"
rounds=${ROUNDS:-2}
for ((r = 1; r <= rounds; r++)); do
    run queue "$work/queue.sql" 1
    for k in 1 4 16; do
        run "today, hand-off of $k" "$(script today$k "$k" false)" "$k"
        run "lot of $k" "$(script lot$k "$k" true)" "$k"
    done
done
