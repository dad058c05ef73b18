"""Reproduce docs/plot.png: the example world model on 2 local nodes (1 CPU rank each) under
`wmctl submit --auto-resume`, node 1 SIGKILLed (keeper, torchrun agent and worker at once, the way
a machine dies) a few heartbeats past a checkpoint, then `wmctl plot`.

    python examples/selfheal_plot.py [-o docs/plot.png] [--steps 200] [--every 40] [--kill-after 20]

Runs in a fresh WMCTL_HOME and checkpoint folder under a temporary directory (kept with --keep);
prints the watcher's output, `wmctl plot --terminal`, and where the picture went. Needs the
`wmctl[plot]` extra and the example's requirements (examples/worldmodel/requirements.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.backends.local.engine import tagged_pids  # noqa: E402

EXAMPLE = REPO / "examples" / "worldmodel"
RUN = "selfheal"


def spec(tmp: Path, steps: int, every: int) -> Path:
    job = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    command = list(job["command"])
    command[command.index("--max_steps") + 1] = str(steps)
    job.update(name=RUN, nodes=2, nproc_per_node=1, command=command, volumes=[],
               checkpoint={"dir": str(tmp / "ckpt"), "every_steps": every, "keep": 3},
               restart={"max_attempts": 3, "backoff": "1s"})
    job["image"]["context"] = str(EXAMPLE)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def events(home: Path) -> list[dict]:
    path = home / "runs" / RUN / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(REPO / "docs" / "plot.png"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=40, help="checkpoint.every_steps")
    ap.add_argument("--kill-after", type=int, default=20, help="kill node 1 this many steps past a checkpoint")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wmctl-selfheal-"))
    env = {**os.environ, "WMCTL_HOME": str(tmp / "home"), "PYTHONPATH": str(REPO)}
    wmctl = [sys.executable, "-m", "orchestrator.cli"]
    started = time.time()
    with open(tmp / "watch.out", "w") as out:
        watcher = subprocess.Popen([*wmctl, "submit", str(spec(tmp, args.steps, args.every)), "--auto-resume"],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        target = None
        while watcher.poll() is None:
            kept = [e for e in events(tmp / "home") if e.get("attempt") == 0]
            ckpts = [e["step"] for e in kept if e["event"] == "checkpoint"]
            if ckpts and target is None:
                target = ckpts[0] + args.kill_after
            if target is not None and any(e["event"] == "step" and e["step"] >= target for e in kept):
                pids = tagged_pids(f"{RUN}-a0/1", exact=True)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                print(f"killed node 1 ({len(pids)} processes) at step {target}, {time.time() - started:.0f} s in")
                break
            time.sleep(0.2)
        code = watcher.wait()
    print((tmp / "watch.out").read_text())
    print(f"wmctl submit exited {code} after {time.time() - started:.0f} s")
    if code != 0:
        return code
    subprocess.run([*wmctl, "plot", RUN, "--terminal"], env=env, cwd=REPO, check=True)
    subprocess.run([*wmctl, "plot", RUN, "-o", str(Path(args.output).resolve())], env=env, cwd=REPO, check=True)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
