#!/usr/bin/env bash
# A throwaway PostgreSQL for development and tests, from Debian's binaries.
#
#   scripts/postgres.sh start  [PORT]   initdb if needed, start, wait until ready,
#                                       create the database "pipeline"; prints the DSN
#   scripts/postgres.sh stop   [PORT]   stop it (pg_ctl stop -m fast)
#   scripts/postgres.sh status [PORT]   exit 0 if it runs and accepts connections, 3 if not
#
# PORT defaults to $PG_PORT or 15432. It listens on 127.0.0.1 only, with trust
# authentication (no password): user "postgres", database "pipeline", so the
# DSN is postgresql://postgres@127.0.0.1:PORT/pipeline. The data directory is
# ${PG_RUN_DIR:-<repo>/.postgres}/PORT/data, its log .../PORT/postgres.log.
#
# PostgreSQL refuses to run as root: as root the server runs as $PG_OS_USER
# (default "postgres", else "nobody"), which owns the port's directory. The
# binaries are taken from $PG_BIN, else the newest /usr/lib/postgresql/*/bin,
# else the PATH; when none is found and we are root, the Debian package
# "postgresql" is installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ACTION="${1:-}"
PORT="${2:-${PG_PORT:-15432}}"
RUN_DIR="${PG_RUN_DIR:-$ROOT/.postgres}"
DB_NAME="${PG_DATABASE:-pipeline}"

usage() {
  echo "usage: $0 start|stop|status [PORT]" >&2
  exit 2
}
die() {
  echo "postgres.sh: $*" >&2
  exit 1
}

[[ "$ACTION" =~ ^(start|stop|status)$ ]] || usage
[[ "$PORT" =~ ^[0-9]+$ ]] || die "PORT must be a number, got '$PORT'"

find_bin() {
  if [[ -n "${PG_BIN:-}" ]]; then
    [[ -x "$PG_BIN/postgres" ]] || die "PG_BIN=$PG_BIN has no postgres binary"
    echo "$PG_BIN"
    return 0
  fi
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [[ -n "$dir" && -x "$dir/postgres" && -x "$dir/initdb" ]]; then
    echo "$dir"
    return 0
  fi
  local postgres
  postgres="$(command -v postgres || true)"
  if [[ -n "$postgres" ]]; then
    dirname "$postgres"
    return 0
  fi
  return 1
}

install_postgres() {
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    die "PostgreSQL binaries not found; install the Debian package 'postgresql' (or set PG_BIN)"
  fi
  echo "postgres.sh: installing the Debian package postgresql" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
}

BIN="$(find_bin || true)"
if [[ -z "$BIN" ]]; then
  [[ "$ACTION" == start ]] || die "PostgreSQL binaries not found"
  install_postgres
  BIN="$(find_bin || true)"
  [[ -n "$BIN" ]] || die "PostgreSQL binaries still not found after installing the package"
fi

PORT_DIR="$RUN_DIR/$PORT"
DATA="$PORT_DIR/data"
LOG="$PORT_DIR/postgres.log"
DSN="postgresql://postgres@127.0.0.1:$PORT/$DB_NAME"

# Run a server-side command as the data directory's owner (never as root).
if [[ $(id -u) -eq 0 ]]; then
  OS_USER="${PG_OS_USER:-}"
  if [[ -z "$OS_USER" ]]; then
    if id postgres >/dev/null 2>&1; then OS_USER=postgres; else OS_USER=nobody; fi
  fi
  as_owner() { (cd / && runuser -u "$OS_USER" -- "$@"); }
else
  OS_USER="$(id -un)"
  as_owner() { (cd / && "$@"); }
fi

ready() {
  "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -d postgres -U postgres -t 1 >/dev/null 2>&1
}

running() {
  [[ -f "$DATA/postmaster.pid" ]] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

psql_() {
  "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres "$@"
}

start() {
  mkdir -p "$RUN_DIR"
  if [[ ! -d "$PORT_DIR" ]]; then
    install -d -m 700 -o "$OS_USER" "$PORT_DIR"
  fi
  if ! as_owner test -w "$PORT_DIR"; then
    die "$PORT_DIR is not writable by $OS_USER (every parent directory must be searchable by it)"
  fi
  if [[ ! -f "$DATA/PG_VERSION" ]]; then
    echo "postgres.sh: initdb $DATA" >&2
    as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C >"$PORT_DIR/initdb.log" 2>&1 ||
      { cat "$PORT_DIR/initdb.log" >&2; die "initdb failed"; }
  fi
  if running; then
    echo "postgres.sh: already running on 127.0.0.1:$PORT" >&2
  else
    # TCP on 127.0.0.1 only; no unix socket (Debian's default socket dir may not exist).
    as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
      -o "-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" start >/dev/null ||
      { tail -n 30 "$LOG" >&2 || true; die "PostgreSQL did not start on port $PORT (see $LOG)"; }
  fi
  local deadline=$((SECONDS + 60))
  until ready; do
    ((SECONDS < deadline)) || { tail -n 30 "$LOG" >&2 || true; die "PostgreSQL is not ready on port $PORT"; }
    sleep 0.2
  done
  if [[ -z "$(psql_ -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" ]]; then
    psql_ -d postgres -c "CREATE DATABASE \"$DB_NAME\"" >/dev/null
  fi
  echo "$DSN"
}

stop() {
  if running; then
    as_owner "$BIN/pg_ctl" -D "$DATA" stop -m fast -w -t 60 >/dev/null
    echo "postgres.sh: stopped 127.0.0.1:$PORT" >&2
  else
    echo "postgres.sh: not running on 127.0.0.1:$PORT" >&2
  fi
}

status() {
  if running && ready; then
    echo "running: $DSN (data $DATA)"
    return 0
  fi
  echo "not running on 127.0.0.1:$PORT (data $DATA)"
  return 3
}

"$ACTION"
