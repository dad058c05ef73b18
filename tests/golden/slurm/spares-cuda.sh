#!/bin/bash
# wmctl plan: run worldmodel, attempt 1, spec 28c05d3fb265
# submitted as: sbatch --parsable --output=/shared/wmctl/runs/worldmodel/attempt-1/batch.log /shared/wmctl/runs/worldmodel/attempt-1/job.sbatch
# note: attempt folder /shared/wmctl/runs/worldmodel/attempt-1: every node writes its log and exit record there, so it must be on a filesystem the nodes and this host share
# note: checkpoints in /workspace/ckpt/worldmodel
# note: checkpoint dir /workspace/ckpt is on volume 'ckpt' (pvc), which Slurm does not mount without a container: the nodes write to /workspace/ckpt on their own filesystems, which must be one shared filesystem for a resume to find it
# note: excluding nodes that failed earlier attempts: gpu-node-7
# note: no container: the nodes run /usr/bin/python3 and the job's code in /specdir, both on the shared filesystem
# note: volumes are not mounted without a container: the job sees the nodes' own folders
# note: 1 spare node(s): the allocation has 3 nodes, one slot each (slots 2 wait as spares); the c10d store runs in the batch script on the allocation's first node, whose slot is the last spare
# note: resources.shm (16Gi) does not apply: a Slurm job uses its nodes' /dev/shm
#SBATCH --job-name=worldmodel-a1
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=64
#SBATCH --gres=gpu:8
#SBATCH --mem=512G
#SBATCH --time=1-00:00:00
#SBATCH --signal=TERM@300
#SBATCH --exclude=gpu-node-7
#SBATCH --no-requeue
#SBATCH --no-kill
#SBATCH --exclusive
#SBATCH --partition=gpu,gpu-long
#SBATCH --account=proj42
#SBATCH --qos=normal
#SBATCH --constraint=a100&ib
#SBATCH --mail-type=END
#SBATCH --hint=nomultithread

# wmctl owns retries (--no-requeue): this script runs once. With spare nodes (restart.spares) the
# allocation holds the job's nodes and its spares, one slot each. Every slot is an srun step of its
# own, pinned to one node, that runs the keeper (orchestrator/runtime/keeper.py): it starts torchrun
# for each round of the rounds folder that names its slot, and waits while none does (a spare). The
# watcher replaces a lost node in place by writing the next round (docs/spares.md). --no-kill: Slurm
# keeps the job when one of its nodes fails. The c10d store runs in this script, on the allocation's
# first node, whose slot is the last spare: the death of a node that trains never takes it down.

set -u
# Slurm signals the job steps, not this shell, with the checkpoint signal (--signal) and with
# `scancel --signal`: the keepers pass it to torchrun, which saves and ends. Slurm's termination of
# the job (scancel, the time limit) signals this shell too: it kills every srun and the store at
# once (an srun told to stop would wait KillWait + 2 s for a node that died) and writes the job's
# exit record whatever came.
srun_pids=()
store_pid=
stopping=
stop_all() {
  local pid
  for pid in "${srun_pids[@]}" $store_pid; do kill -KILL "$pid" 2>/dev/null; done
}
trap 'stopping=1; stop_all' TERM INT HUP

attempt_dir=/shared/wmctl/runs/worldmodel/attempt-1
rounds=$attempt_dir/rounds
slots=3
job_id=${SLURM_JOB_ID:-}
job_id=${job_id//[^0-9_]/}
mkdir -p -- "$attempt_dir"

finish() {
  local now
  if [ -n "$store_pid" ]; then kill -KILL "$store_pid" 2>/dev/null; fi
  printf -v now '%(%s)T' -1
  printf '{"job_id": "%s", "exit_code": %d, "time": %s}\n' "$job_id" "$1" "$now" \
    >"$attempt_dir/job.exit.json.tmp" && mv -f -- "$attempt_dir/job.exit.json.tmp" "$attempt_dir/job.exit.json"
  exit "$1"
}

# wmctl's own teardown (`wmctl cancel`, a failed attempt's) writes the marker below, SIGKILLs the
# steps, then ends the job with scancel (engine._kill). A shell that ended on the steps' exit first
# would leave the job FAILED (exit 137) in Slurm's books, as if the job had failed by itself; it
# waits for that scancel instead (at most 30 s), so Slurm records the job CANCELLED, as it was.
await_teardown() {
  local i
  [ -e "$attempt_dir/teardown.requested" ] || return 0
  for ((i = 0; i < 300; i++)); do
    [ -n "$stopping" ] && return 0
    sleep 0.1
  done
}

cd -- /specdir || finish 1

# The allocation's nodes, this one (where the store runs) first. Slot s runs on node (s + 1) mod
# slots: the last slot, a spare, shares this node with the store. The watcher reads the slots'
# nodes from slots.txt.
mapfile -t hosts < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-}")
if [ -z "${hosts[slots - 1]:-}" ]; then
  echo "wmctl: the allocation (${SLURM_JOB_NODELIST:-}) has fewer nodes than its $slots slots" >&2
  finish 1
fi
for ((s = 0; s < slots; s++)); do printf '%s\n' "${hosts[(s + 1) % slots]}"; done >"$attempt_dir/slots.txt.tmp" &&
  mv -f -- "$attempt_dir/slots.txt.tmp" "$attempt_dir/slots.txt"
rdzv_host=$(scontrol -o show node "${hosts[0]}" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n 1)
rdzv_host=${rdzv_host:-${hosts[0]}}

export WMCTL_RUN=worldmodel
export WMCTL_ATTEMPT=1
export WMCTL_SPEC_HASH=28c05d3fb265
export WMCTL_VENDOR=cuda
export WMCTL_VENDOR_PROFILE='{"aliases":["nvidia"],"device_sources":["nvidia-proc","pci"],"dist_backend":"nccl","libraries":["cuda"],"name":"cuda","pci_vendor_ids":[4318],"smi":["nvidia-smi"],"torch_module":"cuda","torch_plugin":null,"unverified":[],"visible_devices_env":"CUDA_VISIBLE_DEVICES"}'
export WMCTL_TORCH_MODULE=cuda
export WMCTL_DIST_BACKEND=nccl
export WMCTL_AFFINITY=numa
export WMCTL_CHECKPOINT_EVERY=200
export WMCTL_CHECKPOINT_KEEP=3
export WMCTL_RESUME=1
export PYTHONUNBUFFERED=1
export WMCTL_FENCE_EPOCH=1000
export WMCTL_CHECKPOINT_DIR=/workspace/ckpt/worldmodel
export WMCTL_EXPECT_DEVICES=8
export NCCL_DEBUG=WARN

/usr/bin/python3 -m orchestrator.runtime.c10dstore --port 29500 >>"$attempt_dir/store.log" 2>&1 </dev/null &
store_pid=$!

# What each slot's step starts on its node. Its arguments: the attempt folder, the slot, then the
# keeper's command line. The keeper (and every process it starts) carries WMCTL_LOCAL_TAG, by which
# it finds torchrun's workers (sessions of their own) to stop them when a round ends.
slot_script=$(cat <<'WMCTL_SLOT'
dir=$1
slot=$2
shift 2
exec >>"$dir/node-$slot.log" 2>&1
printf '%s\n' "${SLURM_STEP_ID:-}" >"$dir/node-$slot.step.tmp" && mv -f -- "$dir/node-$slot.step.tmp" "$dir/node-$slot.step"
node_name=${SLURMD_NODENAME:-$(hostname)}
export WMCTL_NODE_NAME="$node_name" WMCTL_LOCAL_TAG="slurm-${SLURM_JOB_ID:-}/$slot"
exec "$@"
WMCTL_SLOT
)

if [ -n "$stopping" ]; then finish 143; fi
for ((s = 0; s < slots; s++)); do
  srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=64 --gres=gpu:8 --kill-on-bad-exit=0 \
    --export=ALL \
    --nodelist="${hosts[(s + 1) % slots]}" \
    bash -c "$slot_script" wmctl-slot "$attempt_dir" "$s" \
    /usr/bin/python3 -m orchestrator.runtime.keeper --rounds "$rounds" --slot "$s" --log "$attempt_dir/node-$s.log" \
    --exit-file "$attempt_dir/node-$s.exit.json" --pid-file "$attempt_dir/node-$s.pid.json" -- \
    /usr/bin/python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \
    "--rdzv-endpoint=${rdzv_host}:29500" --rdzv-id=worldmodel-a1 \
    --rdzv-conf=join_timeout=600,read_timeout=600,is_host=false --max-restarts=0 --no-python -- \
    /usr/bin/python3 -m orchestrator.runtime.affinity /usr/bin/python3 train.py --batch_size 4 \
    --gradient_accumulation_steps 8 --max_steps 1000 &
  srun_pids[s]=$!
done

# The slots the newest round names (round-N.json's "active" list, as "0,2").
active() {
  local newest
  newest=$(ls -- "$rounds"/round-*.json 2>/dev/null | tail -n 1)
  [ -n "$newest" ] && sed -n 's/.*"active": \[\([0-9, ]*\)\].*/\1/p' "$newest" | tr -d ' '
}
# The job is done once a slot of the newest round ended 0 (its torchrun succeeded: so did the job)
# and no slot of that round still runs: the idle spares are told to stop (the rounds folder
# closed), and the steps of replaced nodes are left to the job's end.
code=0
done_=
running=$slots
while [ "$running" -gt 0 ] && [ -z "$stopping" ]; do
  wait -n
  now_active=",$(active),"
  busy=
  for s in "${!srun_pids[@]}"; do
    if kill -0 "${srun_pids[s]}" 2>/dev/null; then
      case $now_active in *",$s,"*) busy=1 ;; esac
      continue
    fi
    wait "${srun_pids[s]}"
    rc=$?
    unset 'srun_pids[s]'
    running=$((running - 1))
    if [ "$rc" -gt "$code" ]; then code=$rc; fi
    case $now_active in *",$s,"*) if [ "$rc" -eq 0 ]; then done_=1; fi ;; esac
  done
  if [ -n "$done_" ] && [ -z "$busy" ]; then
    : >"$rounds/closed"
    code=0
    for ((i = 0; i < 50; i++)); do
      left=
      for pid in "${srun_pids[@]}"; do if kill -0 "$pid" 2>/dev/null; then left=1; fi; done
      [ -z "$left" ] && break
      sleep 0.1
    done
    stop_all
    break
  fi
done
await_teardown
if [ -n "$stopping" ]; then finish 143; fi
finish "$code"
