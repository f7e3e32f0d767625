#!/usr/bin/env bash
# Local Prometheus and Alertmanager for retrieval-monitor, with the repo's configs
# (deploy/prometheus, deploy/alertmanager). No Docker and no systemd: the processes are
# started and stopped by this script only.
#
#   monitoring.sh install  put prometheus, promtool, prometheus-alertmanager and amtool
#                          on PATH (Debian packages; as root); nothing if already there
#   monitoring.sh check    promtool check config / check rules / test rules, and
#                          amtool check-config, on the repo's files
#   monitoring.sh up       start Prometheus on 127.0.0.1:9090 and Alertmanager on
#                          127.0.0.1:9093 (idempotent); wait until both are ready
#   monitoring.sh down     stop the processes `up` started (and only those)
#   monitoring.sh status   exit 0 if both run and are ready (3: neither runs)
#
# Environment (all optional):
#   MONITORING_STATE_DIR       state dir, default <repo>/.monitoring (data, logs, pids)
#   PROMETHEUS_LISTEN          default 127.0.0.1:9090
#   ALERTMANAGER_LISTEN        default 127.0.0.1:9093 (Prometheus is pointed at it)
#   MONITORING_START_TIMEOUT   seconds `up` waits for /-/ready, default 60
#   MONITORING_STOP_TIMEOUT    seconds `down` waits after SIGTERM before SIGKILL, default 30
#
# The local Kafka of deploy/local/kafka keeps its KRaft controller on 9094, clear of
# Alertmanager's 9093.
#
# Layout of the state dir:
#   prometheus/prometheus.yml  the repo's config, rendered for this run (absolute rule
#                              paths, the Alertmanager address above)
#   prometheus/data/           TSDB (2 days kept);  alertmanager/data/  silences, state
#   logs/prometheus.log, logs/alertmanager.log
#   prometheus.pid, alertmanager.pid
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
LOG_NAME=monitoring
# shellcheck source=deploy/local/process.sh
. "$HERE/process.sh"

PROMETHEUS_CONFIG="deploy/prometheus/prometheus.yml"
ALERTMANAGER_CONFIG="deploy/alertmanager/alertmanager.yml"

STATE_DIR="${MONITORING_STATE_DIR:-$REPO/.monitoring}"
case "$STATE_DIR" in
    /*) ;;
    *) STATE_DIR="$PWD/$STATE_DIR" ;;
esac
PROMETHEUS_LISTEN="${PROMETHEUS_LISTEN:-127.0.0.1:9090}"
ALERTMANAGER_LISTEN="${ALERTMANAGER_LISTEN:-127.0.0.1:9093}"
START_TIMEOUT="${MONITORING_START_TIMEOUT:-60}"
STOP_TIMEOUT="${MONITORING_STOP_TIMEOUT:-30}"
LOGS="$STATE_DIR/logs"

INSTALL_HINT="run 'bash deploy/local/monitoring.sh install' as root (Debian/Ubuntu: apt-get install prometheus prometheus-alertmanager), or put the release binaries of https://prometheus.io/download/ (prometheus, promtool, alertmanager, amtool) on PATH"

# ---------------------------------------------------------------- helpers
usage() { # exit code
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "$1"
}

# The Alertmanager binary: `prometheus-alertmanager` in Debian, `alertmanager` upstream.
alertmanager_bin() {
    command -v prometheus-alertmanager 2>/dev/null || command -v alertmanager 2>/dev/null
}

missing_tools() {
    local tool missing=()
    for tool in prometheus promtool amtool; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    alertmanager_bin >/dev/null || missing+=(prometheus-alertmanager)
    printf '%s\n' "${missing[@]}"
}

require_tools() {
    local missing
    missing="$(missing_tools | tr '\n' ' ')"
    [[ -z "${missing// /}" ]] || die "not on PATH: ${missing% }; $INSTALL_HINT"
}

check_listen() { # name value
    [[ "$2" =~ ^[^:]+:[0-9]+$ ]] || die "$1=$2 is not host:port"
}

# True if something accepts TCP connections on host:port (bash's /dev/tcp).
port_open() {
    local host="${1%:*}" port="${1##*:}"
    timeout 2 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null
}

ready() { # host:port
    curl -fsS -o /dev/null --max-time 2 "http://$1/-/ready" 2>/dev/null
}

# Print the pid recorded for $1 (prometheus|alertmanager) if that process is alive and
# is the one this script started: its command line must name our state dir. A pid file
# left by a crash or a reboot, or a pid since reused by another program, does not count.
recorded_pid() {
    local pidfile="$STATE_DIR/$1.pid" pid cmdline
    [[ -f "$pidfile" ]] || return 1
    pid="$(tr -cd '0-9' <"$pidfile")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmdline" == *"--config.file=$STATE_DIR/"* || "$cmdline" == *"--storage.path=$STATE_DIR/"* ]] || return 1
    printf '%s\n' "$pid"
}

show_log_tail() { # name
    local f="$LOGS/$1.log"
    if [[ -s "$f" ]]; then
        printf '\n----- last 30 lines of %s -----\n' "$f" >&2
        tail -n 30 "$f" >&2
    fi
}

# Start "$@" detached (new session, SIGHUP ignored, no terminal), output appended to
# logs/<name>.log; the small bash writes its own pid and then becomes the program
# (exec), so the pid file holds the program's pid.
start_detached() { # name command...
    local name="$1" pidfile="$STATE_DIR/$1.pid"
    shift
    mkdir -p "$LOGS"
    rm -f "$pidfile"
    printf '\n===== %s: %s =====\n' "$(date -Is)" "$*" >>"$LOGS/$name.log"
    (
        cd "$STATE_DIR"
        # shellcheck disable=SC2016 # $$, $0 and $@ are for the inner bash
        nohup setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" \
            </dev/null >>"$LOGS/$name.log" 2>&1 &
    )
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s "$pidfile" ]] && return 0
        sleep 0.1
    done
    die "$name did not start (no pid file); see $LOGS/$name.log"
}

wait_ready() { # name host:port
    local name="$1" addr="$2" started=$SECONDS pid
    while :; do
        if ! pid="$(recorded_pid "$name")"; then
            show_log_tail "$name"
            rm -f "$STATE_DIR/$name.pid"
            die "$name exited during startup (log above: $LOGS/$name.log)"
        fi
        ready "$addr" && return 0
        if ((SECONDS - started >= START_TIMEOUT)); then
            show_log_tail "$name"
            stop_pid "$name" "$pid"
            die "$name was not ready on http://$addr/-/ready within ${START_TIMEOUT}s; stopped it"
        fi
        sleep 0.3
    done
}

# SIGTERM, then SIGKILL after STOP_TIMEOUT seconds; only a pid recorded_pid() vouched for.
stop_pid() { # name pid
    terminate_pid "$1" "$2" "$STOP_TIMEOUT"
    rm -f "$STATE_DIR/$1.pid"
}

# Render the repo's prometheus.yml into the state dir: rule files by absolute path (they
# are relative to the config file), and the Alertmanager address of this run.
render_prometheus_config() {
    local out="$STATE_DIR/prometheus/prometheus.yml" rules_dir="$REPO/deploy/prometheus/rules"
    mkdir -p "$STATE_DIR/prometheus"
    local line
    for line in '^  - rules/\*\.yml$' '^ *- 127\.0\.0\.1:9093$'; do
        grep -q "$line" "$REPO/$PROMETHEUS_CONFIG" ||
            die "$PROMETHEUS_CONFIG no longer has a line matching '$line', which up rewrites"
    done
    sed -e "s|^  - rules/\*\.yml$|  - $rules_dir/*.yml|" \
        -e "s|^\( *- \)127\.0\.0\.1:9093$|\1$ALERTMANAGER_LISTEN|" \
        "$REPO/$PROMETHEUS_CONFIG" >"$out.tmp"
    mv "$out.tmp" "$out"
    promtool check config "$out" >"$LOGS/check-config.log" 2>&1 || {
        cat "$LOGS/check-config.log" >&2
        die "the rendered $out is not valid (output above)"
    }
}

# ---------------------------------------------------------------- commands
cmd_install() {
    local missing
    missing="$(missing_tools | tr '\n' ' ')"
    if [[ -z "${missing// /}" ]]; then
        say "prometheus, promtool, alertmanager and amtool are on PATH: nothing to do"
        return 0
    fi
    if [[ "$(id -u)" != 0 ]]; then
        die "not on PATH: ${missing% }. Installing needs root: sudo bash deploy/local/monitoring.sh install
  (it runs: apt-get install --no-install-recommends prometheus prometheus-alertmanager),
  or put the release binaries of https://prometheus.io/download/ on PATH"
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "not on PATH: ${missing% }, and no apt-get here; put the release binaries of https://prometheus.io/download/ on PATH"
    # The packages would start system services (init scripts) on 9090 and 9093 where
    # that is possible; this script runs its own processes instead. Where no
    # policy-rc.d exists, a temporary one (the Debian mechanism) forbids those starts
    # during the installation. Nothing relies on systemd.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\n# temporary, from retrieval-monitor deploy/local/monitoring.sh install\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created_policy=1
        # shellcheck disable=SC2064 # expand now: the path is fixed
        trap "rm -f '$policy'" EXIT
    fi
    say "installing prometheus prometheus-alertmanager (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus prometheus-alertmanager
    if ((created_policy)); then
        rm -f "$policy"
        trap - EXIT
    fi
    missing="$(missing_tools | tr '\n' ' ')"
    [[ -z "${missing// /}" ]] || die "installed, but still not on PATH: ${missing% }"
    say "installed: $(prometheus --version 2>&1 | head -n 1)"
}

cmd_check() {
    require_tools
    cd "$REPO"
    local rc=0
    local rules=(deploy/prometheus/rules/*.yml) tests=(deploy/prometheus/tests/*.yml)
    say "promtool check config $PROMETHEUS_CONFIG"
    promtool check config "$PROMETHEUS_CONFIG" || rc=1
    say "promtool check rules ${rules[*]}"
    promtool check rules "${rules[@]}" || rc=1
    say "promtool test rules ${tests[*]}"
    promtool test rules "${tests[@]}" || rc=1
    say "amtool check-config $ALERTMANAGER_CONFIG"
    amtool check-config "$ALERTMANAGER_CONFIG" || rc=1
    if ((rc)); then
        die "some checks failed (output above)"
    fi
    say "all checks passed"
}

cmd_up() {
    require_tools
    mkdir -p "$STATE_DIR" "$LOGS"
    local am_bin pid name addr
    am_bin="$(alertmanager_bin)"

    # Refuse ports taken by anything this script did not start.
    for name in alertmanager prometheus; do
        [[ "$name" == prometheus ]] && addr="$PROMETHEUS_LISTEN" || addr="$ALERTMANAGER_LISTEN"
        if ! recorded_pid "$name" >/dev/null && port_open "$addr"; then
            die "$addr (for $name) is already in use by a process not started from $STATE_DIR
  $(command -v ss >/dev/null 2>&1 && ss -ltnpH "sport = :${addr##*:}" 2>/dev/null | head -n 1)
  Stop it, or choose another address: PROMETHEUS_LISTEN=... / ALERTMANAGER_LISTEN=...
  (the local Kafka's KRaft controller uses 9093 by default: KAFKA_CONTROLLER_PORT)"
        fi
    done

    if pid="$(recorded_pid alertmanager)"; then
        say "alertmanager already running (pid $pid)"
    else
        mkdir -p "$STATE_DIR/alertmanager/data"
        start_detached alertmanager "$am_bin" \
            --config.file="$REPO/$ALERTMANAGER_CONFIG" \
            --storage.path="$STATE_DIR/alertmanager/data" \
            --web.listen-address="$ALERTMANAGER_LISTEN" \
            --cluster.listen-address=
    fi
    wait_ready alertmanager "$ALERTMANAGER_LISTEN"
    say "alertmanager ready: http://$ALERTMANAGER_LISTEN (pid $(recorded_pid alertmanager))"

    if pid="$(recorded_pid prometheus)"; then
        say "prometheus already running (pid $pid)"
    else
        render_prometheus_config
        mkdir -p "$STATE_DIR/prometheus/data"
        start_detached prometheus prometheus \
            --config.file="$STATE_DIR/prometheus/prometheus.yml" \
            --storage.tsdb.path="$STATE_DIR/prometheus/data" \
            --storage.tsdb.retention.time=2d \
            --web.listen-address="$PROMETHEUS_LISTEN" \
            --web.enable-lifecycle
    fi
    wait_ready prometheus "$PROMETHEUS_LISTEN"
    say "prometheus ready: http://$PROMETHEUS_LISTEN (pid $(recorded_pid prometheus)), scraping the targets of $PROMETHEUS_CONFIG"
    say "logs: $LOGS; stop with: bash deploy/local/monitoring.sh down"
}

cmd_down() {
    local name pid
    for name in prometheus alertmanager; do
        if pid="$(recorded_pid "$name")"; then
            say "stopping $name (pid $pid)"
            stop_pid "$name" "$pid"
        elif [[ -f "$STATE_DIR/$name.pid" ]]; then
            say "$name not running; removing its stale pid file"
            rm -f "$STATE_DIR/$name.pid"
        else
            say "$name not running"
        fi
    done
}

cmd_status() {
    local name addr pid running=0 ok=1
    for name in prometheus alertmanager; do
        [[ "$name" == prometheus ]] && addr="$PROMETHEUS_LISTEN" || addr="$ALERTMANAGER_LISTEN"
        if pid="$(recorded_pid "$name")"; then
            running=$((running + 1))
            if ready "$addr"; then
                say "$name running (pid $pid), ready on http://$addr"
            else
                say "$name running (pid $pid) but not ready on http://$addr"
                ok=0
            fi
        else
            say "$name not running"
            ok=0
        fi
    done
    ((running)) || return 3
    ((ok)) || return 1
}

check_listen PROMETHEUS_LISTEN "$PROMETHEUS_LISTEN"
check_listen ALERTMANAGER_LISTEN "$ALERTMANAGER_LISTEN"

case "${1:-}" in
    install) cmd_install ;;
    check) cmd_check ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    -h | --help | help) usage 0 ;;
    *) usage 2 ;;
esac
