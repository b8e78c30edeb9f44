#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL when DATABASE_URL is unset:
# initdb into a temp dir, start it on a free loopback port, export DATABASE_URL, run, tear down.
set -euo pipefail

if [ -n "${DATABASE_URL:-}" ]; then
  exec "$@"
fi

PG_BIN="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
  PG_BIN="$(dirname "$(command -v initdb || echo /nonexistent/initdb)")"
fi
[ -x "$PG_BIN/initdb" ] || { echo "PostgreSQL server binaries (initdb) not found; apt-get install postgresql" >&2; exit 2; }

PGROOT="$(mktemp -d /tmp/agentruns-pg.XXXXXX)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')"
AS=()
if [ "$(id -u)" = "0" ]; then
  chown postgres "$PGROOT"
  AS=(runuser -u postgres --)
fi

cleanup() {
  "${AS[@]}" "$PG_BIN/pg_ctl" -D "$PGROOT/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$PGROOT"
}
trap cleanup EXIT INT TERM

"${AS[@]}" "$PG_BIN/initdb" -D "$PGROOT/data" -A trust -U postgres --no-sync -E UTF8 >/dev/null
# The defaults are for tests (benchmarks pass PG_EXTRA_OPTS=" "): fsync off, the database may lose
# data on power loss; autovacuum off, because an ANALYZE that runs while a test holds 10,000 rows
# in its still-open transaction records the tables as empty (it cannot see those rows), and the
# planner then joins the inbox's tables with full scans per row: the page took minutes (twice in
# a loaded suite; every time when such an ANALYZE is run by hand). Tests never run long enough to
# need vacuuming, and never-analyzed tables are estimated from their size, which is right.
"${AS[@]}" "$PG_BIN/pg_ctl" -D "$PGROOT/data" -l "$PGROOT/pg.log" -w \
  -o "-p $PORT -k $PGROOT -c listen_addresses=127.0.0.1 -c max_connections=300 ${PG_EXTRA_OPTS:--c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off}" start >/dev/null
"$PG_BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -qc "CREATE DATABASE agentruns" >/dev/null

export DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/agentruns"
echo "throwaway PostgreSQL on 127.0.0.1:$PORT" >&2
"$@"
