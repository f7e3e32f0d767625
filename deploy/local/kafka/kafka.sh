#!/usr/bin/env bash
# Local single-node Apache Kafka broker (KRaft mode: one JVM is broker and controller)
# on 127.0.0.1, built from the Maven Central jars. No Docker, no tarball download.
#
#   kafka.sh up            start it (idempotent), wait until it answers, print bootstrap
#   kafka.sh down [--wipe] stop the broker this script started; --wipe deletes its data
#   kafka.sh reachable     exit 0 if any broker answers on the port (ours or not)
#   kafka.sh status        exit 0 if it is running and answering (1: running but not
#                          answering, 3: not running)
#
# Environment (all optional):
#   KAFKA_STATE_DIR        state dir, default <repo>/.kafka (jars, data, logs, pid file)
#   KAFKA_PORT             client listener, default 9092
#   KAFKA_CONTROLLER_PORT  KRaft controller listener, default 9094 (9093 is Alertmanager's)
#   KAFKA_VERSION          org.apache.kafka:kafka_2.13 version, default 4.4.0
#                          (if unset and 4.4.0 does not resolve, 4.3.1 is used)
#   KAFKA_START_TIMEOUT    seconds `up` waits for the broker to answer, default 120
#   KAFKA_STOP_TIMEOUT     seconds `down` waits after SIGTERM before SIGKILL, default 30
#   KAFKA_HEAP_OPTS        default "-Xms512m -Xmx1g"
#   KAFKA_JAVA_OPTS        extra JVM options, appended
#   KAFKA_EXTRA_PROPERTIES a file appended to the rendered server.properties
#   KAFKA_PYTHON           Python with kafka-python for the readiness check,
#                          default <repo>/.venv/bin/python (`make kafka-up` creates it)
#
# A second, independent broker (e.g. for a test) needs its own state dir and ports:
#   KAFKA_STATE_DIR=/tmp/k2 KAFKA_PORT=19092 KAFKA_CONTROLLER_PORT=19093 kafka.sh up
#
# Layout of the state dir:
#   libs/             the jars (downloaded once by mvn; libs/.complete says which)
#   data/             log.dirs: topics and the KRaft metadata log (`down --wipe` deletes)
#   logs/server.log   the broker's log;  logs/kafka.out  its console (WARN+, JVM errors)
#   server.properties rendered from server.properties.in on each start
#   kafka.pid         pid of the running broker;  kafka.run  its ports
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_NAME=kafka
# shellcheck source=deploy/local/process.sh
. "$HERE/../process.sh"
REPO="$(cd "$HERE/../../.." && pwd)"

DEFAULT_KAFKA_VERSION=4.4.0
FALLBACK_KAFKA_VERSION=4.3.1
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
HOST=127.0.0.1

# ---------------------------------------------------------------- settings
STATE_DIR="${KAFKA_STATE_DIR:-$REPO/.kafka}"
case "$STATE_DIR" in
    /*) ;;
    *) STATE_DIR="$PWD/$STATE_DIR" ;; # the JVM runs elsewhere: make it absolute
esac
PORT="${KAFKA_PORT:-9092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9094}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g}"
PYTHON="${KAFKA_PYTHON:-$REPO/.venv/bin/python}"
BOOTSTRAP="$HOST:$PORT"

LIBS="$STATE_DIR/libs"
DATA="$STATE_DIR/data"
LOGS="$STATE_DIR/logs"
CONF="$STATE_DIR/server.properties"
PIDFILE="$STATE_DIR/kafka.pid"
RUNFILE="$STATE_DIR/kafka.run"
FORMATFILE="$DATA/.kafka-sh-format" # how data/ was formatted (cluster id, Kafka version)

# ---------------------------------------------------------------- helpers
usage() { # exit code
    sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "$1"
}

check_port_number() { # name value
    if ! [[ "$2" =~ ^[0-9]+$ ]] || ((10#$2 < 1 || 10#$2 > 65535)); then
        die "$1=$2 is not a TCP port number"
    fi
}

# Print the last lines of the broker's logs, to explain a failed start.
show_log_tail() {
    local f
    for f in "$LOGS/server.log" "$LOGS/kafka.out" "$LOGS/readiness.log"; do
        if [[ -s "$f" ]]; then
            printf '\n----- last 40 lines of %s -----\n' "$f" >&2
            tail -n 40 "$f" >&2
        fi
    done
}

# Take an exclusive lock on the state dir, so that two `up`/`down` at once (parallel
# make, two terminals) do not start two brokers or race on the pid file. Held until
# this script exits. Skipped where flock(1) is missing.
lock_state_dir() {
    mkdir -p "$STATE_DIR"
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"$STATE_DIR/.lock"
    flock -w $((START_TIMEOUT + STOP_TIMEOUT + 30)) 9 ||
        die "another kafka.sh holds $STATE_DIR/.lock"
}

# Print the pid of the broker this script started from this state dir, if it is alive.
# The pid in the pid file must still be a java process running kafka.Kafka with *our*
# config file: a pid file left by a crash, a reboot or a pid reused by another program
# does not count (the caller then treats the pid file as stale).
broker_pid() {
    local pid cmdline
    [[ -f "$PIDFILE" ]] || return 1
    pid="$(tr -cd '0-9' <"$PIDFILE")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmdline" == *" kafka.Kafka $CONF"* ]] || return 1
    printf '%s\n' "$pid"
}

# True if something accepts TCP connections on 127.0.0.1:$1 (bash's /dev/tcp).
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

# True if the broker answers an admin request (metadata: list_topics) on $1.
# An open port is not enough: the broker accepts connections before it has joined
# the KRaft quorum and unfenced itself. The check's own output goes to
# logs/readiness.log (shown if `up` times out). A Python without a working
# kafka-python (exit 3) is reported at once instead of being waited on.
admin_ok() {
    [[ -x "$PYTHON" ]] || die "no Python at $PYTHON for the readiness check: run 'make venv' (or set KAFKA_PYTHON)"
    local rc=0
    mkdir -p "$LOGS"
    timeout 30 "$PYTHON" - "$1" >"$LOGS/readiness.log" 2>&1 <<'PY' || rc=$?
import logging
import sys

logging.disable(logging.CRITICAL)  # kafka-python logs connection retries at ERROR
try:
    from kafka import KafkaAdminClient
except ImportError as e:
    print(f"kafka-python is not importable: {e}")
    sys.exit(3)

config = {
    "bootstrap_servers": sys.argv[1],
    "client_id": "kafka-sh-readiness",
    "request_timeout_ms": 5000,
}
# The bootstrap timeout option was renamed across kafka-python versions.
for name in ("bootstrap_timeout_ms", "api_version_auto_timeout_ms"):
    if name in KafkaAdminClient.DEFAULT_CONFIG:
        config[name] = 5000
        break
admin = KafkaAdminClient(**config)
try:
    admin.list_topics()
finally:
    admin.close()
PY
    if ((rc == 3)); then
        cat "$LOGS/readiness.log" >&2
        die "the readiness check cannot run with $PYTHON: run 'make venv' (or set KAFKA_PYTHON)"
    fi
    return "$rc"
}

# ---------------------------------------------------------------- java and jars
find_java() {
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        JAVA="$JAVA_HOME/bin/java"
    else
        JAVA="$(command -v java)" || die "java not found: Kafka 4 needs Java 17 or newer (apt-get install openjdk-17-jre-headless)"
    fi
    local major
    major="$("$JAVA" -XshowSettings:properties -version 2>&1 |
        sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p')"
    [[ -n "$major" && "$major" -ge 17 ]] ||
        die "$JAVA is Java ${major:-?}: the Kafka 4 broker needs Java 17 or newer"
}

# Download the broker's jars into $LIBS with Maven, unless they are already there.
# libs/.complete records the requested version, the version obtained and a checksum of
# pom.xml: a change to either downloads again. The download goes to a temporary dir
# and is moved into place only when complete, so an interrupted run leaves no half set.
ensure_libs() {
    local requested="${KAFKA_VERSION:-$DEFAULT_KAFKA_VERSION}"
    local pom_sum wanted
    pom_sum="$(sha256sum "$HERE/pom.xml" | cut -c1-16)"
    wanted="requested=$requested pom=$pom_sum"
    if [[ -f "$LIBS/.complete" ]] && grep -qxF "$wanted" "$LIBS/.complete"; then
        KAFKA_RESOLVED="$(sed -n 's/^resolved=//p' "$LIBS/.complete")"
        return 0
    fi

    command -v mvn >/dev/null 2>&1 || die "mvn not found: it fetches the Kafka jars from Maven Central (apt-get install maven)"
    mkdir -p "$LOGS"
    local work="$STATE_DIR/libs.download" version
    local candidates=("$requested")
    # The fallback applies only to the default, not to a version asked for explicitly.
    [[ -z "${KAFKA_VERSION:-}" ]] && candidates+=("$FALLBACK_KAFKA_VERSION")

    for version in "${candidates[@]}"; do
        say "downloading Kafka $version jars with Maven into $LIBS (first run only; ~45 MB)"
        rm -rf "$work"
        mkdir -p "$work/jars"
        # Run Maven in the state dir on a copy of the pom, so nothing lands in the repo.
        cp "$HERE/pom.xml" "$work/pom.xml"
        # Maven 3.8's -q still prints colour codes: its output goes to a log file,
        # shown only if it fails.
        # -U: re-check artifacts that failed before (Maven otherwise caches a failed
        # lookup, e.g. from a network hiccup, and refuses to retry for a day).
        if (cd "$work" && mvn -q -B -U -Dstyle.color=never -f pom.xml \
            "$DEPENDENCY_PLUGIN:copy-dependencies" \
            -Dkafka.version="$version" -DincludeScope=runtime \
            -DoutputDirectory="$work/jars") </dev/null >"$LOGS/maven.log" 2>&1 &&
            compgen -G "$work/jars/kafka_2.13-*.jar" >/dev/null; then
            printf '%s\nresolved=%s\n' "$wanted" "$version" >"$work/jars/.complete"
            rm -rf "$LIBS"
            mv "$work/jars" "$LIBS"
            rm -rf "$work"
            KAFKA_RESOLVED="$version"
            return 0
        fi
        warn "Maven could not fetch Kafka $version (log: $LOGS/maven.log):"
        sed 's/\x1b\[[0-9;]*m//g' "$LOGS/maven.log" | grep -m 3 -E '^\[ERROR\] .*[a-z]' >&2 || true
    done
    rm -rf "$work"
    die "could not download the Kafka jars (tried ${candidates[*]}); see $LOGS/maven.log"
}

# ---------------------------------------------------------------- config and storage
# Escape a value for the replacement side of a sed s|...|...| command.
sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# Render server.properties.in: every ${NAME} or ${NAME:-default} of the names below
# becomes the value computed above. Anything left unreplaced is an error.
render_config() {
    local tmp="$CONF.tmp" name value
    local -A values=(
        [KAFKA_PORT]="$PORT"
        [KAFKA_CONTROLLER_PORT]="$CONTROLLER_PORT"
        [KAFKA_DATA_DIR]="$DATA"
    )
    cp "$HERE/server.properties.in" "$tmp"
    for name in "${!values[@]}"; do
        value="$(sed_escape "${values[$name]}")"
        sed -i -E "s|\\$\\{$name(:-[^}]*)?\\}|$value|g" "$tmp"
    done
    local unknown
    # shellcheck disable=SC2016 # a literal "${" is searched for
    unknown="$(grep -v '^[[:space:]]*#' "$tmp" | grep -o '\${[^}]*}' | sort -u | tr '\n' ' ' || true)"
    if [[ -n "$unknown" ]]; then
        rm -f "$tmp"
        die "server.properties.in has placeholders kafka.sh does not know: $unknown"
    fi
    if [[ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]]; then
        [[ -r "$KAFKA_EXTRA_PROPERTIES" ]] || die "KAFKA_EXTRA_PROPERTIES=$KAFKA_EXTRA_PROPERTIES is not readable"
        printf '\n# ----- appended from %s -----\n' "$KAFKA_EXTRA_PROPERTIES" >>"$tmp"
        cat "$KAFKA_EXTRA_PROPERTIES" >>"$tmp"
    fi
    mv "$tmp" "$CONF"
}

# A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 chars).
# Like Kafka's Uuid.randomUuid(), never one starting with '-' (the command line would
# take it for an option).
new_cluster_id() {
    local id
    while :; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
        [[ "$id" != -* ]] && break
    done
    printf '%s\n' "$id"
}

# Format data/ once. A data dir that holds data (meta.properties) is kept and reused
# (Kafka recovers it after a crash); one without meta.properties is a leftover of an
# interrupted format and is cleared. Data formatted by a newer Kafka than the jars
# (e.g. after falling back to 4.3.1) cannot be read: say so instead of deleting it.
# (A changed KAFKA_CONTROLLER_PORT is fine: the single voter updates its endpoint.)
ensure_formatted() {
    if [[ -f "$DATA/meta.properties" ]]; then
        local fmt_version
        fmt_version="$(sed -n 's/^kafka_version=//p' "$FORMATFILE" 2>/dev/null || true)"
        if [[ -n "$fmt_version" && "$fmt_version" != "$KAFKA_RESOLVED" ]] &&
            [[ "$(printf '%s\n%s\n' "$fmt_version" "$KAFKA_RESOLVED" | sort -V | tail -n 1)" == "$fmt_version" ]]; then
            die "$DATA was formatted by Kafka $fmt_version, newer than $KAFKA_RESOLVED (which cannot read it).
  Delete the data with: $0 down --wipe"
        fi
        return 0
    fi

    local cluster_id
    cluster_id="$(new_cluster_id)"
    rm -rf "$DATA"
    mkdir -p "$DATA" "$LOGS"
    say "formatting $DATA (cluster id $cluster_id)"
    if ! "$JAVA" -Xmx256m -Dlog4j2.configurationFile="file:$HERE/log4j2.properties" \
        -Dkafka.logs.dir="$LOGS" -cp "$LIBS/*" \
        kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$CONF" \
        >"$LOGS/format.log" 2>&1; then
        cat "$LOGS/format.log" >&2
        rm -rf "$DATA"
        die "formatting the storage failed (log above, also in $LOGS/format.log)"
    fi
    printf 'cluster_id=%s\ncontroller_port=%s\nkafka_version=%s\n' \
        "$cluster_id" "$CONTROLLER_PORT" "$KAFKA_RESOLVED" >"$FORMATFILE"
}

# ---------------------------------------------------------------- start / stop
start_broker() {
    mkdir -p "$LOGS"
    rm -f "$PIDFILE"
    # Kafka's own JVM defaults (kafka-run-class.sh), with a small fixed heap.
    # shellcheck disable=SC2206 # word splitting of the option strings is intended
    local jvm=($HEAP_OPTS -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent
        -Djava.awt.headless=true
        "-Dlog4j2.configurationFile=file:$HERE/log4j2.properties"
        "-Dkafka.logs.dir=$LOGS"
        ${KAFKA_JAVA_OPTS:-})
    printf '\n===== %s: starting Kafka %s on %s =====\n' "$(date -Is)" "$KAFKA_RESOLVED" "$BOOTSTRAP" >>"$LOGS/kafka.out"
    # Detach: new session (setsid: no controlling terminal, not in make's process
    # group), SIGHUP ignored (nohup), stdin from /dev/null and output to a file, so
    # that neither the terminal nor make waits for it or kills it. The small bash
    # writes its own pid and then *becomes* java (exec), so the pid file holds java's
    # pid whatever setsid does about forking. fd 9 (the state dir lock) is closed for
    # it, or the broker would hold the lock for its whole life.
    (
        cd "$STATE_DIR"
        # shellcheck disable=SC2016 # $$, $0 and $@ are for the inner bash
        nohup setsid bash -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" \
            "$JAVA" "${jvm[@]}" -cp "$LIBS/*" kafka.Kafka "$CONF" \
            </dev/null >>"$LOGS/kafka.out" 2>&1 9>&- &
    )
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s "$PIDFILE" ]] && break
        sleep 0.1
    done
    [[ -s "$PIDFILE" ]] || die "the broker did not start (no pid file); see $LOGS/kafka.out"
    printf 'port=%s\ncontroller_port=%s\nversion=%s\n' "$PORT" "$CONTROLLER_PORT" "$KAFKA_RESOLVED" >"$RUNFILE"
}

# Wait until the broker accepts connections and answers an admin call. Fails early if
# the process dies; on timeout stops it (no half-started broker is left behind).
wait_ready() {
    local started=$SECONDS pid
    while :; do
        if ! pid="$(broker_pid)"; then
            show_log_tail
            rm -f "$PIDFILE" "$RUNFILE"
            die "the broker exited during startup (logs above: $LOGS/server.log, $LOGS/kafka.out)"
        fi
        if port_open "$PORT" && admin_ok "$BOOTSTRAP"; then
            return 0
        fi
        if ((SECONDS - started >= START_TIMEOUT)); then
            show_log_tail
            stop_pid "$pid"
            die "the broker did not answer on $BOOTSTRAP within ${START_TIMEOUT}s; stopped it (logs above: $LOGS/server.log)"
        fi
        sleep 0.5
    done
}

# SIGTERM (Kafka shuts down cleanly: closes logs, leaves the quorum), then SIGKILL
# after STOP_TIMEOUT seconds. Only the given pid, which broker_pid() vouched for.
stop_pid() {
    terminate_pid broker "$1" "$STOP_TIMEOUT"
    rm -f "$PIDFILE" "$RUNFILE"
}

# ---------------------------------------------------------------- commands
cmd_up() {
    lock_state_dir
    local pid t0=$SECONDS
    if pid="$(broker_pid)"; then
        local run_port
        run_port="$(sed -n 's/^port=//p' "$RUNFILE" 2>/dev/null || true)"
        if [[ -n "$run_port" && "$run_port" != "$PORT" ]]; then
            die "a broker from $STATE_DIR is already running on port $run_port (pid $pid), not $PORT: run '$0 down' first, or use another KAFKA_STATE_DIR"
        fi
        if port_open "$PORT" && admin_ok "$BOOTSTRAP"; then
            say "already running (pid $pid)"
            say "ready: bootstrap.servers=$BOOTSTRAP"
            return 0
        fi
        say "already started (pid $pid) but not answering yet: waiting"
        wait_ready
        say "ready: bootstrap.servers=$BOOTSTRAP (pid $pid)"
        return 0
    fi
    if [[ -f "$PIDFILE" ]]; then
        warn "removing stale pid file $PIDFILE (pid $(cat "$PIDFILE" 2>/dev/null) is not a broker of ours)"
        rm -f "$PIDFILE" "$RUNFILE"
    fi

    # Another program (or a broker from another state dir) on our ports: fail now,
    # with a clear message, rather than after a 2-minute wait.
    local p
    for p in "$PORT" "$CONTROLLER_PORT"; do
        if port_open "$p"; then
            die "port $HOST:$p is already in use by a process not started from $STATE_DIR
  $(command -v ss >/dev/null 2>&1 && ss -ltnpH "sport = :$p" 2>/dev/null | head -n 1)
  Stop it, or choose other ports: KAFKA_PORT=... KAFKA_CONTROLLER_PORT=... (and a separate KAFKA_STATE_DIR)"
        fi
    done

    find_java
    ensure_libs
    render_config
    ensure_formatted
    start_broker
    pid="$(cat "$PIDFILE")"
    say "starting Kafka $KAFKA_RESOLVED (pid $pid, state $STATE_DIR); waiting up to ${START_TIMEOUT}s"
    wait_ready
    say "ready after $((SECONDS - t0))s: bootstrap.servers=$BOOTSTRAP (logs: $LOGS/server.log)"
}

cmd_down() {
    local wipe=0 arg pid
    for arg in "$@"; do
        case "$arg" in
            --wipe) wipe=1 ;;
            *) die "down: unknown option $arg (only --wipe)" ;;
        esac
    done
    if [[ ! -d "$STATE_DIR" ]]; then
        say "not running (no $STATE_DIR)"
        return 0
    fi
    lock_state_dir
    if pid="$(broker_pid)"; then
        say "stopping the broker (pid $pid)"
        stop_pid "$pid"
        say "stopped"
    elif [[ -f "$PIDFILE" ]]; then
        say "not running; removing stale pid file"
        rm -f "$PIDFILE" "$RUNFILE"
    else
        say "not running"
    fi
    if ((wipe)); then
        rm -rf "$DATA"
        say "deleted $DATA"
    fi
}

cmd_status() {
    local pid
    if ! pid="$(broker_pid)"; then
        say "not running ($STATE_DIR)"
        return 3
    fi
    if port_open "$PORT" && admin_ok "$BOOTSTRAP"; then
        say "running (pid $pid): bootstrap.servers=$BOOTSTRAP"
        return 0
    fi
    say "running (pid $pid) but not answering on $BOOTSTRAP"
    return 1
}

# Exit 0 if any Kafka broker (ours or not) answers on $BOOTSTRAP.
cmd_reachable() {
    if port_open "$PORT" && admin_ok "$BOOTSTRAP"; then
        say "a broker answers on $BOOTSTRAP"
        return 0
    fi
    return 1
}

check_port_number KAFKA_PORT "$PORT"
check_port_number KAFKA_CONTROLLER_PORT "$CONTROLLER_PORT"
[[ "$PORT" != "$CONTROLLER_PORT" ]] || die "KAFKA_PORT and KAFKA_CONTROLLER_PORT must differ"

case "${1:-}" in
    up) cmd_up ;;
    down)
        shift
        cmd_down "$@"
        ;;
    status) cmd_status ;;
    reachable) cmd_reachable ;;
    -h | --help | help) usage 0 ;;
    *) usage 2 ;;
esac
