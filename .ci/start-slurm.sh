#!/usr/bin/env bash
# Start a real Slurm cluster on this host for the tests, or find the one already running. Idempotent.
#
# One slurmctld and three slurmd (`slurmd -N n1|n2|n3`), all on 127.0.0.1, each node with its own
# Port=, from Debian 12's packages (Slurm 22.05). It
# - installs slurmctld slurmd slurm-client munge when missing (apt, quiet);
# - starts munged (key /etc/munge/munge.key, socket in /run/munge) unless one already answers;
# - writes $WMCTL_SLURM_CONF (default /etc/wmctl-slurm/slurm.conf): the tests find it there or in
#   SLURM_CONF; state, spool, pid and log files go under $WMCTL_SLURM_DIR (default
#   /var/lib/wmctl-slurm), which this script owns;
# - starts each daemon that is not running (a daemon whose pid file names a live process is left
#   alone; a changed slurm.conf restarts them all), then polls `sinfo` until n1 n2 n3 are idle
#   (at most $WMCTL_SLURM_WAIT seconds, default 60).
# stdout: one line, the slurm.conf path (`export SLURM_CONF="$(bash .ci/start-slurm.sh)"`);
# everything else, the time it took included, goes to stderr.
set -euo pipefail

DIR="${WMCTL_SLURM_DIR:-/var/lib/wmctl-slurm}"
CONF="${WMCTL_SLURM_CONF:-/etc/wmctl-slurm/slurm.conf}"
WAIT="${WMCTL_SLURM_WAIT:-60}"
# Ports of our own (Slurm's defaults are 6817/6818): the controller, then one per node.
PORT_BASE="${WMCTL_SLURM_PORT_BASE:-26810}"
# Slurm's default SlurmdTimeout is 300 s: a node silent that long is set DOWN "Not responding".
# The tests shorten it so a killed node is DOWN in about 30 s; the product must not rely on it.
SLURMD_TIMEOUT="${WMCTL_SLURMD_TIMEOUT:-10}"
NODES=(n1 n2 n3)

t0=$(date +%s.%N)
say() { echo "start-slurm: $*" >&2; }
# A daemon keeps every fd it inherits: one left open on CI's output pipe would keep the CI step
# waiting for an EOF that never comes. Run it with only stdin/stdout/stderr (each daemon points
# those at /dev/null once it has detached; its start-up errors still reach our stderr).
detached() {
    ( for fd in /proc/"$BASHPID"/fd/*; do
          fd=${fd##*/}
          [ "$fd" -gt 2 ] && eval "exec $fd>&-"
      done 2>/dev/null
      exec "$@" </dev/null )
}
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

need_pkgs=()
command -v slurmctld >/dev/null 2>&1 || need_pkgs+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need_pkgs+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need_pkgs+=(slurm-client)
command -v munged >/dev/null 2>&1 || need_pkgs+=(munge)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    say "installing ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
    say "installed in $(elapsed)s"
fi

# --- munge: every Slurm message is signed by it -----------------------------------------------
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating /etc/munge/munge.key"
        mungekey -c -k /etc/munge/munge.key
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 0700 /etc/munge
    chmod 0600 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    rm -f /run/munge/munge.socket.2.lock
    say "starting munged"
    detached runuser -u munge -- munged
    for _ in $(seq 1 50); do munge_ok && break; sleep 0.1; done
    munge_ok || { say "munged does not answer (munge -n | unmunge)"; exit 1; }
fi

# --- slurm.conf -------------------------------------------------------------------------------
mkdir -p "$DIR"/{state,spool,run,log} "$(dirname "$CONF")"
new_conf="$(mktemp "$(dirname "$CONF")/.slurm.conf.XXXXXX")"
{
    cat <<EOF
# Written by .ci/start-slurm.sh: a test cluster of one slurmctld and three slurmd on this host.
ClusterName=wmctl
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# Every slurmd shares this host's process tree and has no cgroups of its own.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The nodes declare CPUs and memory the box does not have (3 nodes x 4 CPUs on 2 cores):
# config_overrides keeps them from being drained for it.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Default 300 s; short here so a killed node is DOWN within seconds.
SlurmdTimeout=$SLURMD_TIMEOUT
# A node that was DOWN returns to service when its slurmd registers again.
ReturnToService=2
# MinJobAge left at its default (300 s): a finished job stays visible to scontrol that long.
EOF
    port=$PORT_BASE
    for n in "${NODES[@]}"; do
        port=$((port + 1))
        echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=4 RealMemory=4000 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$new_conf"

export SLURM_CONF="$CONF"
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [ -f "$CONF" ] && cmp -s "$new_conf" "$CONF"; then
    rm -f "$new_conf"
else
    # A different (or no) config: the daemons that run now run the old one; stop them.
    for pidfile in "$DIR"/run/slurmd-*.pid "$DIR"/run/slurmctld.pid; do
        if pid_alive "$pidfile"; then
            say "config changed: stopping $(basename "$pidfile" .pid)"
            pid=$(cat "$pidfile")
            kill "$pid"
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
    done
    mv -f "$new_conf" "$CONF"
    chmod 0644 "$CONF"
fi

started=()
if ! pid_alive "$DIR/run/slurmctld.pid"; then
    # -c: a fresh controller forgets the jobs of an earlier one (a test cluster keeps no history).
    detached slurmctld -f "$CONF" -c
    started+=(slurmctld)
fi
for n in "${NODES[@]}"; do
    if ! pid_alive "$DIR/run/slurmd-$n.pid"; then
        mkdir -p "$DIR/spool/$n"
        detached slurmd -f "$CONF" -N "$n"
        started+=("slurmd-$n")
    fi
done
if [ "${#started[@]}" -gt 0 ]; then
    say "started ${started[*]}"
else
    say "all daemons already running"
fi

# --- wait until every node is idle ------------------------------------------------------------
deadline=$(( $(date +%s) + WAIT ))
want="$(printf '%s idle\n' "${NODES[@]}")"
while :; do
    got="$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)"
    [ "$got" = "$want" ] && break
    if [ "$(date +%s)" -ge "$deadline" ]; then
        say "nodes not all idle within ${WAIT}s; sinfo says:"
        sinfo -N -o '%N %T %E' >&2 || true
        for f in "$DIR"/log/*.log; do say "--- $f"; tail -n 15 "$f" >&2 || true; done
        exit 1
    fi
    sleep 0.2
done
say "cluster up in $(elapsed)s: $(echo "$got" | tr '\n' ' ')(SLURM_CONF=$CONF)"
echo "$CONF"
