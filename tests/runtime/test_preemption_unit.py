"""PreemptionHandler in one process, the dist helpers it relies on, and the short PG timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.runtime import dist
from orchestrator.runtime.preemption import PreemptionHandler
from orchestrator.runtime.protocol import PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_only_sets_the_flag(sig: int) -> None:
    before = signal.getsignal(sig)
    with PreemptionHandler() as h:
        assert not h.should_stop()
        os.kill(os.getpid(), sig)        # delivered before os.kill returns (main thread)
        assert h.received == sig and h.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert h.received == sig          # the first signal is the one reported
    assert signal.getsignal(sig) == before


def test_exit_preempted_uses_the_protocol_code() -> None:
    with pytest.raises(SystemExit) as exc:
        PreemptionHandler.exit_preempted()
    assert exc.value.code == PREEMPTED_EXIT_CODE == 83


def test_single_process_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WMCTL_PG_TIMEOUT", "WMCTL_DIST_BACKEND"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WMCTL_TORCH_MODULE", "cpu")
    assert not dist.init_from_env()
    assert (dist.rank(), dist.world_size(), dist.local_rank(), dist.is_main()) == (0, 1, 0, True)
    dist.barrier()
    assert dist.all_reduce_max(7) == 7 and dist.broadcast_object({"a": 1}) == {"a": 1}
    assert dist.pg_timeout_s() == dist.DEFAULT_PG_TIMEOUT_S == 120.0
    monkeypatch.setenv("WMCTL_PG_TIMEOUT", "7.5")
    assert dist.pg_timeout_s() == 7.5
    monkeypatch.setenv("WMCTL_PG_TIMEOUT", "soon")      # unparsable -> the default, not a crash
    assert dist.pg_timeout_s() == 120.0
    assert dist.device_module() is None and dist.default_backend() == "gloo"
    monkeypatch.setenv("WMCTL_TORCH_MODULE", "no_such_module")
    assert dist.device_module() is None
    monkeypatch.setenv("WMCTL_DIST_BACKEND", "mccl")
    assert dist.default_backend() == "mccl"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_short_pg_timeout_turns_a_vanished_peer_into_an_error(tmp_path: Path) -> None:
    """A rank whose peer never reaches the collective fails after WMCTL_PG_TIMEOUT, not 30 min."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        from orchestrator.runtime import dist
        dist.init_from_env()
        if dist.rank() == 1:
            time.sleep(150)          # the vanished peer
        try:
            dist.barrier()
        except Exception as err:     # gloo raises on the process-group timeout
            print("TIMEOUT", type(err).__name__, flush=True)
            os._exit(5)
        print("NO-TIMEOUT", flush=True)
    """))
    # 10 s, not less: the timeout covers init_process_group too, where both ranks import torch on a
    # loaded machine; the point is seconds, not the 30 minutes of the default
    env = {**os.environ, "PYTHONPATH": str(REPO), "WMCTL_PG_TIMEOUT": "10", "WMCTL_TORCH_MODULE": "cpu"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, env=env, timeout=170, cwd=REPO)
    assert "TIMEOUT" in out.stdout and "NO-TIMEOUT" not in out.stdout, out.stdout + out.stderr[-3000:]
    assert out.returncode != 0
