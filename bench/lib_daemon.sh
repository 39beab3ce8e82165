# bench/lib_daemon.sh — waiting for and stopping the tlmd a bench script started (sourced by
# bench/server.sh and bench/e2e.sh from the repository root; POSIX sh). The script starts the
# daemon itself (its own flags, port and log) and keeps its pid in $pid ("" when none runs).
#   daemon_wait TRIES CMD...   runs the readiness probe CMD every 0.1 s: 0 once it succeeds,
#                              1 when the daemon has exited or TRIES probes have failed
#   stop_daemon                SIGTERM, up to 30 s, then SIGKILL; reaps it and clears $pid
pid=""

daemon_wait() {
    _dw_tries=$1
    shift
    for _ in $(seq 1 "$_dw_tries"); do
        "$@" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

stop_daemon() {
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do # up to 30 s, then SIGKILL
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
}
