"""DataLoader registration with the checkpoint manager (orchestrator/runtime/loader.py), in
one process: a resumed iterator continues the epoch and the RNG as the uninterrupted one did,
a DataLoader iterated after the resume amends the resume to not exact, and bad input is
refused clearly. The same under real torchrun with SIGKILL: test_resume_exact_loader.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.runtime.checkpoint import CheckpointManager
from orchestrator.runtime import loader as loader_mod
from orchestrator.runtime.loader import _dataloader_class

REPO = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter: a DataLoader another test left alive would (rightly) make any
# resume in this process not exact.
SCENARIO = r'''
import io, json, sys
import torch
from orchestrator.runtime.checkpoint import CheckpointManager
from orchestrator.runtime.progress import Progress

root, workers = sys.argv[1], int(sys.argv[2])
ds = torch.utils.data.TensorDataset(torch.arange(40.0).unsqueeze(1))

def make():
    return torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers)

def rest(it):   # the rest of the epoch, then a dropout-like draw from the global RNG
    return [b[0].flatten().tolist() for b in it], torch.rand(3).tolist()

torch.manual_seed(5)
loader = make()
mgr = CheckpointManager(root)
mgr.register(loader=loader)
it = iter(loader)
for _ in range(4):
    next(it)
torch.rand(2)                       # the model's own draws between batches
mgr.save(4)
expected = rest(it)
mgr.close()
del it, loader, mgr

torch.manual_seed(123)              # the resumed process starts elsewhere
out = io.StringIO()
loader = make()
mgr = CheckpointManager(root, progress=Progress(stream=out, enabled=True))
mgr.register(loader=loader)
state = mgr.restore()
got = rest(iter(loader))
late = make()                       # built after the resume, never registered
next(iter(late))
mgr.close()
print(json.dumps({"same": got == expected, "exact": state.exact, "reason": state.reason,
                  "lines": out.getvalue().splitlines()}))
'''


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_iterator_continues_the_epoch_and_a_later_unregistered_loader_amends_the_resume(
        tmp_path: Path, workers: int) -> None:
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ckpt"), str(workers)], capture_output=True,
                          text=True, timeout=240, cwd=REPO, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.strip().splitlines()[-1])
    assert res["same"] is True and res["exact"] is True and res["reason"] == ""
    amended = [json.loads(line.split(" ", 1)[1]) for line in res["lines"] if line.startswith("WMCTL-PROGRESS")]
    assert [(e["event"], e["step"], e["exact"], e["reason"], e["amended"]) for e in amended] == \
        [("resume", 4, False, "unregistered DataLoader", True)]
    assert "the resume from step 4 is not exact: unregistered DataLoader" in done.stderr


def test_register_refuses_what_is_not_a_dataloader_and_one_loader_under_two_names(tmp_path: Path) -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=2)
    mgr = CheckpointManager(tmp_path / "ckpt")
    try:
        with pytest.raises(TypeError, match=r"takes a torch.utils.data.DataLoader; got _SingleProcessDataLoaderIter"):
            mgr.register(loader=iter(loader))
        mgr.register(loader=loader)
        with pytest.raises(ValueError, match="'train' is already registered as 'loader'"):
            mgr.register(loaders={"train": loader})
    finally:
        mgr.close()
    # Closed: no longer watching; with no other manager open, DataLoader.__iter__ is torch's own again.
    assert mgr._loaders not in list(loader_mod._trackers)
    if not list(loader_mod._trackers):
        assert _dataloader_class().__iter__.__module__ == "torch.utils.data.dataloader"
