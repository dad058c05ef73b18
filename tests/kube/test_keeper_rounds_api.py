"""The keeper's Kubernetes round source (runtime/keeper.py ``--rounds-url``): a real keeper
process reads its attempt's rounds ConfigMap through the (fake) API server over HTTP, as a pod's
keeper reads it with its service-account token, and acts on a new round within a second."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchestrator.backends.kubernetes.spares import ROUND_KEY, round_doc
from orchestrator.plan import AttemptContext
from orchestrator.runtime import keeper
from orchestrator.runtime.protocol import ENV_LOCAL_TAG
from orchestrator.vendors import load_profile

from ..unit.helpers import full_spec, render_plan
from .fakeapi.api import RESOURCES
from .fakeapi.rbac import User

CM = RESOURCES[("v1", "configmaps")]
KEEPER = Path(keeper.__file__)
NS, ROUNDS = "training", "worldmodel-a0-rounds"     # full.yaml's namespace and run, attempt 0
TOKEN = "a-service-account-token"


@pytest.fixture
def keeper_rbac(fake_api):
    """RBAC on, and the pods' service account (full.yaml's ``trainer``) given exactly what a plan
    with spares grants it: its Role and RoleBinding, rendered."""
    plan = render_plan(full_spec("cpu", **{"restart.spares": 1}), load_profile("cpu"), "kubernetes",
                       AttemptContext(attempt=0))
    rbac = [o for o in plan.resources if o["kind"] in ("Role", "RoleBinding")]
    assert {o["kind"] for o in rbac} == {"Role", "RoleBinding"}
    fake_api.as_user(TOKEN, User.service_account(NS, "trainer"), manifests=rbac)
    return fake_api


def _keeper(fake_api, tmp_path: Path, slot: int, command: list[str], hold: float | None = None) -> subprocess.Popen:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    url = f"{fake_api.server.url}/api/v1/namespaces/{NS}/configmaps/{ROUNDS}"
    argv = [sys.executable, "-I", str(KEEPER), "--rounds-url", url, "--token-file", str(token),
            "--slot-env", "SLOT", "--log", str(tmp_path / f"log{slot}"),
            "--exit-file", str(tmp_path / f"exit{slot}.json"), "--pid-file", str(tmp_path / f"pid{slot}.json")]
    argv += ["--hold", str(hold)] if hold is not None else []
    return subprocess.Popen([*argv, "--", *command], env={"SLOT": str(slot), ENV_LOCAL_TAG: f"kr-{slot}-{time.time()}"})


def _rounds(fake_api, data: dict[str, str]) -> None:
    if fake_api.store.exists("configmaps", NS, ROUNDS):
        fake_api.store.update("configmaps", NS, ROUNDS, lambda cm: cm["data"].update(data))
    else:
        fake_api.api.create(CM, NS, {"metadata": {"name": ROUNDS}, "data": data})


def _wait(pred, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def test_keeper_takes_its_rounds_from_the_configmap(keeper_rbac, tmp_path):
    """A spare's keeper (slot 2) waits while round 0 names slots 0 and 1; round 1 written to the
    ConfigMap names it, and it runs its command with the round's environment; ``closed`` ends a
    waiting keeper with exit 0. RBAC is on: the keepers read with the service account's token,
    which the plan's Role lets read that ConfigMap and nothing else."""
    fake_api = keeper_rbac
    _rounds(fake_api, {ROUND_KEY.format(n=0): round_doc(0, [0, 1], "rdzv", {})})
    out = tmp_path / "ran"
    spare = _keeper(fake_api, tmp_path, 2, [sys.executable, "-c",
                                            f"import os; open({str(out)!r}, 'w').write(os.environ['SAYS'])"])
    idle = _keeper(fake_api, tmp_path, 3, [sys.executable, "-c", "raise SystemExit(3)"])
    try:
        assert _wait(lambda: (tmp_path / "pid2.json").exists())
        assert not out.exists()
        _rounds(fake_api, {ROUND_KEY.format(n=1): round_doc(1, [0, 2], "rdzv-r1", {"SAYS": "round 1"})})
        assert _wait(lambda: out.exists() and out.read_text() == "round 1")
        assert spare.wait(timeout=30) == 0
        assert json.loads((tmp_path / "exit2.json").read_text())["round"] == 1
        _rounds(fake_api, {keeper.CLOSED: "1"})
        assert idle.wait(timeout=30) == 0
        assert not (tmp_path / "exit3.json").exists()       # it never ran a round
    finally:
        for p in (spare, idle):
            p.kill()
            p.wait()
    reads = fake_api.api.sent("GET", f"/configmaps/{ROUNDS}")
    assert reads and all(r["code"] == 200 for r in reads), reads[-3:]
    # each keeper read the ConfigMap once and then watched it (allowed by the Role's resourceNames
    # through the watch's metadata.name field selector): no read every moment
    assert len(reads) == 2, reads
    watches = [r for r in fake_api.api.sent("GET", f"/namespaces/{NS}/configmaps")
               if r["query"].get("watch") in ("1", "true")]
    assert len(watches) == 2 and all(r["query"]["fieldSelector"] == f"metadata.name={ROUNDS}" and r["code"] == 200
                                     for r in watches), watches
    other = urllib.request.Request(f"{fake_api.server.url}/api/v1/namespaces/{NS}/configmaps/something-else",
                                   headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(other, timeout=10)
    assert refused.value.code == 403       # the Role names its one ConfigMap (resourceNames)


def test_keeper_with_a_hold_ends_with_its_failure_when_no_round_follows(keeper_rbac, tmp_path):
    """A pod's keeper (``--hold``) whose torchrun failed waits that long for a newer round, then
    exits with the failure's code: the pod fails, so the job's own error reaches the watcher."""
    fake_api = keeper_rbac
    _rounds(fake_api, {ROUND_KEY.format(n=0): round_doc(0, [0], "rdzv", {})})
    started = time.monotonic()
    proc = _keeper(fake_api, tmp_path, 0, [sys.executable, "-c", "raise SystemExit(7)"], hold=1.0)
    try:
        assert proc.wait(timeout=60) == 7
    finally:
        proc.kill()
    assert time.monotonic() - started >= 1.0


def test_a_watching_keeper_forks_its_prewarmed_torchrun(keeper_rbac, tmp_path):
    """A pod's keeper runs ``python3 -m torch.distributed.run``: it imports torchrun while it waits
    and forks it for the round (keeper.Forked), with its rounds watch's thread running. The fork
    must neither hang nor lose the round's environment: torchrun starts its worker, which sees it."""
    fake_api = keeper_rbac
    _rounds(fake_api, {ROUND_KEY.format(n=0): round_doc(0, [0], "rdzv", {"SAYS": "forked"})})
    out = tmp_path / "worker"
    torchrun = [sys.executable, "-m", keeper.TORCHRUN_MODULE, "--standalone", "--nnodes=1", "--nproc-per-node=1",
                "--rdzv-id=rdzv", "--max-restarts=0", "--no-python", "--", sys.executable, "-c",
                f"import os; agent = open(f'/proc/{{os.getppid()}}/cmdline').read(); "
                f"open({str(out)!r}, 'w').write(' '.join([os.environ['SAYS'], os.environ['LOCAL_RANK'], "
                "str('keeper.py' in agent)]))"]
    proc = _keeper(fake_api, tmp_path, 0, torchrun, hold=1.0)
    try:
        assert proc.wait(timeout=120) == 0, (tmp_path / "log0").read_text()
    finally:
        proc.kill()
    assert out.read_text() == "forked 0 True"       # its torchrun is the keeper forked, not a new interpreter
