#!/usr/bin/env bash
# Start a Docker engine for the tests, or reuse the one already running. Idempotent.
#
# - installs Debian's docker.io (+ debootstrap for the test base image, docker-registry for push
#   tests) when missing;
# - starts dockerd in the background, logs to $WMCTL_DOCKERD_LOG (default /tmp/wmctl-dockerd.log);
# - waits until `docker info` answers (at most $WMCTL_DOCKERD_WAIT seconds, default 60).
# Honours DOCKER_HOST: when it points at a remote engine, only waits for it.
set -euo pipefail

LOG="${WMCTL_DOCKERD_LOG:-/tmp/wmctl-dockerd.log}"
WAIT="${WMCTL_DOCKERD_WAIT:-60}"

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
command -v docker-registry >/dev/null 2>&1 || need_pkgs+=(docker-registry)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    echo "start-dockerd: installing ${need_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
fi

engine_up() { docker info >/dev/null 2>&1; }

if engine_up; then
    echo "start-dockerd: engine already running" >&2
    exit 0
fi

if [ -n "${DOCKER_HOST:-}" ] && [[ "${DOCKER_HOST}" != unix://* ]]; then
    echo "start-dockerd: DOCKER_HOST=${DOCKER_HOST} is remote; waiting for it" >&2
else
    # A dockerd that is starting (pid file present, process alive) is waited for, not doubled.
    pidfile=/var/run/docker.pid
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "start-dockerd: dockerd (pid $(cat "$pidfile")) is starting; waiting" >&2
    else
        rm -f "$pidfile"
        # containerd: dockerd starts its own when none runs. setsid + nohup: the engine outlives
        # this script and the CI step that called it.
        echo "start-dockerd: starting dockerd, log $LOG" >&2
        setsid nohup dockerd --pidfile "$pidfile" >"$LOG" 2>&1 </dev/null &
    fi
fi

for _ in $(seq 1 "$WAIT"); do
    if engine_up; then
        echo "start-dockerd: engine ready ($(docker version --format '{{.Server.Version}}'))" >&2
        exit 0
    fi
    sleep 1
done
echo "start-dockerd: engine did not come up within ${WAIT}s; last log lines:" >&2
tail -n 30 "$LOG" >&2 || true
exit 1
