# shellcheck shell=bash
# Shared by kafka.sh and monitoring.sh (sourced, not run). Set LOG_NAME first: it
# prefixes every message.

say() { printf '%s: %s\n' "$LOG_NAME" "$*"; }
warn() { printf '%s: %s\n' "$LOG_NAME" "$*" >&2; }
die() {
    printf '%s: ERROR: %s\n' "$LOG_NAME" "$*" >&2
    exit 1
}

# terminate_pid NAME PID TIMEOUT_S: SIGTERM, then SIGKILL if PID still runs TIMEOUT_S
# seconds later. Only ever called with a pid the caller recorded and checked itself.
terminate_pid() {
    local name="$1" pid="$2" timeout="$3" waited=0
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= timeout * 10)); then
            warn "$name (pid $pid) still running ${timeout}s after SIGTERM: sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.5
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}
