#!/usr/bin/env bash
# `make demo`: three demo backends and seamless with demo/haproxy.cfg, on
# 127.0.0.1. Ctrl-C drains and stops: the terminal sends SIGINT to its
# foreground process group, which holds this script and seamless (HAProxy
# runs in a group of its own); seamless drains HAProxy, and only then are
# the backends stopped. They run in sessions of their own (setsid) so that
# Ctrl-C does not stop them under a request in flight, and seamless gets no
# second signal from here: a second stop signal means "stop hard now".
#
# The variables are for the test (demo/demo_test.go), which runs this on
# free ports: DEMO_BIN_DIR (bin), DEMO_CONFIG (demo/haproxy.cfg),
# DEMO_RUN_DIR (.cache/demo-run), DEMO_PIDFILE (.cache/demo.pid, read by
# `make demo-reload`), DEMO_STATUS_ADDR (127.0.0.1:8405) and
# DEMO_BACKEND_PORTS ("9001 9002 9003"; demo/haproxy.cfg names them).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${DEMO_BIN_DIR:-bin}
run=${DEMO_RUN_DIR:-$PWD/.cache/demo-run}
pidfile=${DEMO_PIDFILE:-$PWD/.cache/demo.pid}
read -r -a ports <<<"${DEMO_BACKEND_PORTS:-9001 9002 9003}"
mkdir -p "$run" "$(dirname "$pidfile")"

backends=()
stop_backends() {
	((${#backends[@]})) || return 0
	kill -TERM "${backends[@]}" 2>/dev/null
	wait "${backends[@]}" 2>/dev/null
	backends=()
}
seamless=
# Leaving early (seamless failed to start, or this script was told to
# stop): nothing may outlive the demo.
trap 'stop_backends; rm -f "$pidfile"' EXIT

i=0
for port in "${ports[@]}"; do
	i=$((i + 1))
	setsid "$bin"/demo-backend -listen "127.0.0.1:$port" -name "web$i" &
	backends+=($!)
done

SEAMLESS_RUN_DIR=$run SEAMLESS_STATUS_ADDR=${DEMO_STATUS_ADDR:-127.0.0.1:8405} \
	"$bin"/seamless haproxy -f "${DEMO_CONFIG:-demo/haproxy.cfg}" &
seamless=$!
echo "$seamless" >"$pidfile"

# Ctrl-C reached seamless already: wait for its drain. A SIGTERM or SIGHUP
# (the terminal closed) sent to this script alone is passed on, once.
trap '' INT
forwarded=
trap '[ -n "$forwarded" ] || kill -TERM "$seamless" 2>/dev/null; forwarded=1' TERM HUP
while :; do
	wait "$seamless"
	status=$?
	# wait returns early when a trapped signal arrives; seamless may still
	# be draining.
	kill -0 "$seamless" 2>/dev/null || break
done
stop_backends
exit "$status"
