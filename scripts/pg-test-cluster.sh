#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster for the test suite and prints the admin URL.
#
#   eval "$(scripts/pg-test-cluster.sh start DIR)"   # exports HUDDLE_TEST_DATABASE_URL
#   scripts/pg-test-cluster.sh stop DIR
#
# The cluster runs with fsync off (fast tests); PG_DURABLE=1 keeps fsync and full page
# writes on, as benchmarks measure.
#
# Uses the machine's initdb/pg_ctl (PATH, then /usr/lib/postgresql/*/bin). As root
# the server runs as the `postgres` system user.
set -euo pipefail

cmd=${1:?usage: pg-test-cluster.sh start|stop DIR}
dir=${2:?usage: pg-test-cluster.sh start|stop DIR}

find_bin() {
    if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return; fi
    local b
    b=$(ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$b" ] || { echo "error: $1 not found; install the PostgreSQL server (apt-get install postgresql)" >&2; exit 1; }
    echo "$b"
}

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
    initdb=$(find_bin initdb)
    pg_ctl=$(find_bin pg_ctl)
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    as_pg "$initdb" -D "$dir/data" -U postgres -A trust --no-sync >"$dir/initdb.log" 2>&1
    durability="-c fsync=off -c full_page_writes=off"
    [ "${PG_DURABLE:-0}" = 1 ] && durability="-c fsync=on -c full_page_writes=on"
    as_pg "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 $durability -c max_connections=400" \
        start >/dev/null
    echo "export HUDDLE_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    pg_ctl=$(find_bin pg_ctl)
    as_pg "$pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    ;;
*)
    echo "usage: pg-test-cluster.sh start|stop DIR" >&2; exit 2 ;;
esac
