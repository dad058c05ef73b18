#!/bin/bash
# wmctl plan: run worldmodel, attempt 1, spec e185e679aba0
# submitted as: sbatch --parsable --output=/shared/wmctl/runs/worldmodel/attempt-1/batch.log /shared/wmctl/runs/worldmodel/attempt-1/job.sbatch
# note: attempt folder /shared/wmctl/runs/worldmodel/attempt-1: every node writes its log and exit record there, so it must be on a filesystem the nodes and this host share
# note: checkpoints in /workspace/ckpt/worldmodel
# note: excluding nodes that failed earlier attempts: gpu-node-7
# note: apptainer converts the image on each node at first use (its cache: ~/.apptainer/cache)
# note: resources.shm (16Gi) does not apply: a Slurm job uses its nodes' /dev/shm
#SBATCH --job-name=worldmodel-a1
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=64
#SBATCH --gres=gpu:8
#SBATCH --mem=512G
#SBATCH --time=1-00:00:00
#SBATCH --signal=TERM@300
#SBATCH --exclude=gpu-node-7
#SBATCH --no-requeue
#SBATCH --exclusive
#SBATCH --partition=gpu,gpu-long
#SBATCH --account=proj42
#SBATCH --qos=normal
#SBATCH --constraint=a100&ib
#SBATCH --mail-type=END
#SBATCH --hint=nomultithread

# wmctl owns retries (--no-requeue): this script runs once. It starts one srun step, one task per
# node; each task runs torchrun under the node script below, which keeps the node's log and leaves
# its exit record in the attempt folder. Every node and the submit host share that folder, so a
# watcher learns how the job ended even when Slurm has forgotten it (MinJobAge).

set -u
# Slurm signals the job steps, not this shell, with the checkpoint signal (--signal) and with
# `scancel --signal`: the steps save and end by themselves. Slurm's termination of the job (scancel,
# the time limit) signals this shell too, and the steps with it; srun, told to stop, would wait
# KillWait + 2 s (32 s by default) for a node that died, keeping this node COMPLETING meanwhile. So
# a signal here kills srun at once (the steps keep their own signal) and the job's exit record is
# written whatever came.
srun_pid=
stopping=
trap 'stopping=1; if [ -n "$srun_pid" ]; then kill -KILL "$srun_pid" 2>/dev/null; fi' TERM INT HUP

attempt_dir=/shared/wmctl/runs/worldmodel/attempt-1
job_id=${SLURM_JOB_ID:-}
job_id=${job_id//[^0-9_]/}
mkdir -p -- "$attempt_dir"

finish() {
  local now
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

cd -- /shared/wmctl/runs/worldmodel/attempt-1 || finish 1

# The rendezvous host: node 0's NodeAddr, the address Slurm itself reaches it at (node names need
# not resolve). This script runs on node 0, the first node of the allocation.
node0=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" | head -n 1)
rdzv_host=$(scontrol -o show node "$node0" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n 1)
rdzv_host=${rdzv_host:-$node0}
if [ -z "$rdzv_host" ]; then
  echo "wmctl: scontrol names no node for SLURM_JOB_NODELIST=${SLURM_JOB_NODELIST:-}" >&2
  finish 1
fi

export NVIDIA_DRIVER_CAPABILITIES=compute,utility
export WMCTL_RUN=worldmodel
export WMCTL_ATTEMPT=1
export WMCTL_SPEC_HASH=e185e679aba0
export WMCTL_VENDOR=cuda
export WMCTL_VENDOR_PROFILE='{"aliases":["nvidia"],"device_sources":["nvidia-proc","pci"],"dist_backend":"nccl","libraries":["cuda"],"name":"cuda","pci_vendor_ids":[4318],"smi":["nvidia-smi"],"torch_module":"cuda","torch_plugin":null,"unverified":[],"visible_devices_env":"CUDA_VISIBLE_DEVICES"}'
export WMCTL_TORCH_MODULE=cuda
export WMCTL_DIST_BACKEND=nccl
export WMCTL_AFFINITY=numa
export WMCTL_CHECKPOINT_EVERY=200
export WMCTL_CHECKPOINT_KEEP=3
export WMCTL_RESUME=1
export PYTHONUNBUFFERED=1
export WMCTL_CHECKPOINT_DIR=/workspace/ckpt/worldmodel
export WMCTL_EXPECT_DEVICES=8
export NCCL_DEBUG=WARN

# What srun starts on every node. Its arguments: the attempt folder, then torchrun's command line.
# The node's SLURM_NODEID is torchrun's node rank, and node 0 hosts the c10d store (is_host): its
# NodeAddr need not be a name torch recognises as its own.
node_script=$(cat <<'WMCTL_NODE'
dir=$1
shift
node=${SLURM_NODEID:?wmctl: SLURM_NODEID is unset: this runs under srun}
mkdir -p -- "$dir"
exec >>"$dir/node-$node.log" 2>&1
node_name=${SLURMD_NODENAME:-$(hostname)}
export PET_NODE_RANK="$node" WMCTL_NODE_NAME="$node_name"
# is_host on torchrun's --rdzv-conf, from PET_NODE_RANK (orchestrator/launch.py STORE_HOST_SH)
h=false; [ "$PET_NODE_RANK" = 0 ] && h=true; o=1
for a; do shift
  if [ "$o" = 1 ]; then case $a in --) o=0 ;; --rdzv-conf=*) a="$a,is_host=$h" ;; esac; fi
  set -- "$@" "$a"
done
# Slurm signals every process of the step: torchrun and its workers save and stop by themselves,
# and this shell waits for them to record how the node ended, and that a signal came: a worker
# that died of it before the runtime could save (the time limit's signal inside torch's import)
# ended by the scheduler's hand, not by the job's error.
signalled=0
trap 'signalled=1' TERM INT HUP
"$@"
code=$?
host=${node_name//[^A-Za-z0-9._-]/_}
job_id=${SLURM_JOB_ID:-}
printf -v now '%(%s)T' -1
printf '{"node": %d, "host": "%s", "exit_code": %d, "job_id": "%s", "time": %s, "signalled": %d}\n' \
  "$node" "$host" "$code" "${job_id//[^0-9_]/}" "$now" "$signalled" >"$dir/node-$node.exit.json.tmp" &&
  mv -f -- "$dir/node-$node.exit.json.tmp" "$dir/node-$node.exit.json"
exit "$code"
WMCTL_NODE
)

if [ -n "$stopping" ]; then finish 143; fi
srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=64 --gres=gpu:8 --kill-on-bad-exit=0 \
    --export=ALL \
  apptainer exec --nv --bind /shared/wmctl/runs/worldmodel:/shared/wmctl/runs/worldmodel \
    --bind /shared/data:/workspace/data:ro --bind /shared/ckpt:/workspace/ckpt --pwd /workspace \
    docker://registry.example.com/team/worldmodel:v3 bash -c "$node_script" wmctl-node "$attempt_dir" \
  torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d "--rdzv-endpoint=${rdzv_host}:29500" \
    --rdzv-id=worldmodel-a1 --rdzv-conf=join_timeout=600,read_timeout=600 --max-restarts=0 --no-python \
    -- wmctl-bind python train.py --batch_size 4 --gradient_accumulation_steps 8 --max_steps 1000 &
srun_pid=$!
while :; do
  wait "$srun_pid"
  code=$?
  kill -0 "$srun_pid" 2>/dev/null || break
done
await_teardown
finish "$code"
