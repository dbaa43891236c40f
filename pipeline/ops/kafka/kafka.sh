#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft broker+controller) from Maven Central jars.
#
#   deploy/kafka/kafka.sh fetch            download the jars (cached)
#   deploy/kafka/kafka.sh start [PORT]     start on 127.0.0.1:PORT (default 9092), wait until ready
#   deploy/kafka/kafka.sh stop [PORT]      stop it cleanly
#   deploy/kafka/kafka.sh status [PORT]    exit 0 when running and answering
#   deploy/kafka/kafka.sh restart [PORT]   stop then start, keeping the data
#   deploy/kafka/kafka.sh logs [PORT]      print the tail of the broker log
#   deploy/kafka/kafka.sh wipe [PORT]      stop and delete the data
#
# Environment: KAFKA_PORT, KAFKA_CONTROLLER_PORT (default PORT+1),
# KAFKA_RUN_DIR (default <repo>/.kafka), KAFKA_CACHE_DIR (default
# ~/.cache/webhook-pipeline), KAFKA_HEAP (default 512m), KAFKA_RETENTION_CHECK_MS
# (how often the broker deletes by retention; default 30000, the tests use 2000).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/pom.xml")"
CACHE_DIR="${KAFKA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/webhook-pipeline}"
LIB_DIR="$CACHE_DIR/kafka-$KAFKA_VERSION/lib"

cmd="${1:-status}"
PORT="${2:-${KAFKA_PORT:-9092}}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
RUN_DIR="${KAFKA_RUN_DIR:-$REPO/.kafka}/$PORT"
PID_FILE="$RUN_DIR/kafka.pid"
LOG_FILE="$RUN_DIR/kafka.log"
PYTHON="${PYTHON:-python3}"

say() { echo "kafka.sh: $*" >&2; }

fetch() {
  if [[ -f "$LIB_DIR/.complete" ]]; then return 0; fi
  say "fetching Apache Kafka $KAFKA_VERSION from Maven Central into $LIB_DIR (once; about 40 MB, a minute or so)"
  rm -rf "$LIB_DIR" && mkdir -p "$LIB_DIR"
  mvn -q -B -f "$HERE/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$LIB_DIR" -DincludeScope=runtime
  touch "$LIB_DIR/.complete"
}

running_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid; pid="$(cat "$PID_FILE")"
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

cluster_id() {
  sed -n 's/^cluster.id=//p' "$RUN_DIR/data/meta.properties" 2>/dev/null
}

java_run() {
  java -cp "$LIB_DIR/*" "$@"
}

write_config() {
  mkdir -p "$RUN_DIR/data"
  cat > "$RUN_DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$RUN_DIR/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.check.interval.ms=${KAFKA_RETENTION_CHECK_MS:-30000}
PROPS
}

start() {
  if pid="$(running_pid)"; then say "already running on 127.0.0.1:$PORT (pid $pid)"; return 0; fi
  local busy
  if ! busy="$("$PYTHON" "$HERE/probe.py" --free "127.0.0.1:$PORT" "127.0.0.1:$CONTROLLER_PORT")"; then
    say "port ${busy##*:} on 127.0.0.1 is in use by another process; stop it or choose other ports" \
      "(PORT, KAFKA_CONTROLLER_PORT): a broker this script did not start is never used"
    return 1
  fi
  fetch
  write_config
  if [[ ! -f "$RUN_DIR/data/meta.properties" ]]; then
    say "formatting new storage in $RUN_DIR/data"
    local cluster_id; cluster_id="$(java_run kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
    java_run -Dlog4j2.configurationFile="$HERE/log4j2.properties" -Dkafka.logs.file="$LOG_FILE" \
      kafka.tools.StorageTool format -t "$cluster_id" -c "$RUN_DIR/server.properties" >/dev/null
  fi
  local started; started="$(date +%s%3N)"
  : >> "$LOG_FILE"
  nohup java -Xms256m -Xmx"${KAFKA_HEAP:-512m}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:ActiveProcessorCount=2 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" -Dkafka.logs.file="$LOG_FILE" \
    -cp "$LIB_DIR/*" kafka.Kafka "$RUN_DIR/server.properties" \
    >> "$RUN_DIR/kafka.out" 2>&1 < /dev/null &
  local pid=$! cluster; cluster="$(cluster_id)"
  echo "$pid" > "$PID_FILE"
  say "started the broker (pid $pid, cluster $cluster); waiting up to ${KAFKA_START_TIMEOUT:-90}s for 127.0.0.1:$PORT"
  local code=0
  "$PYTHON" "$HERE/probe.py" "127.0.0.1:$PORT" "${KAFKA_START_TIMEOUT:-90}" --cluster-id "$cluster" || code=$?
  if [[ $code -eq 0 ]] && ! kill -0 "$pid" 2>/dev/null; then code=3; fi
  if [[ $code -ne 0 ]]; then
    case $code in
      2) say "another broker answers on 127.0.0.1:$PORT (not cluster $cluster); last log lines:" ;;
      3) say "the broker (pid $pid) exited although 127.0.0.1:$PORT answers; last log lines:" ;;
      *) say "broker did not become ready on 127.0.0.1:$PORT; last log lines:" ;;
    esac
    tail -n 40 "$LOG_FILE" "$RUN_DIR/kafka.out" >&2 || true
    stop || true
    return 1
  fi
  local ms=$(( $(date +%s%3N) - started ))
  say "ready on 127.0.0.1:$PORT in $((ms / 1000)).$(printf %03d $((ms % 1000)))s (logs: $LOG_FILE)"
}

stop() {
  local pid
  if ! pid="$(running_pid)"; then rm -f "$PID_FILE"; return 0; fi
  kill -TERM "$pid"
  for _ in $(seq 1 120); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$PID_FILE"; say "stopped (port $PORT)"; return 0; }
    sleep 0.25
  done
  say "broker did not stop within 30s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PID_FILE"
}

case "$cmd" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  status)
    if pid="$(running_pid)" && "$PYTHON" "$HERE/probe.py" "127.0.0.1:$PORT" 5 --cluster-id "$(cluster_id)"; then
      echo "running on 127.0.0.1:$PORT (pid $pid)"
    else
      echo "not running on 127.0.0.1:$PORT"; exit 1
    fi ;;
  logs) tail -n "${LINES:-80}" "$LOG_FILE" ;;
  wipe) stop; rm -rf "$RUN_DIR" ;;
  *) say "usage: kafka.sh fetch|start|stop|restart|status|logs|wipe [PORT]"; exit 2 ;;
esac
