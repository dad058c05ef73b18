"""Where `wmctl submit` puts a run's watcher (api.place_watcher, api.start_watcher): here in the
foreground, detached, in the cluster, or nowhere, from --watch/--no-watch, --detach, --in-cluster
and the run's auto-resume."""

from __future__ import annotations

import pytest
import yaml

from orchestrator import api
from orchestrator.errors import OptionError


@pytest.fixture
def request_for(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "placed", "image": {"vendor": "cpu"},
                                    "command": ["python", "-c", "pass"]}))
    made = []

    def make(auto_resume: bool) -> api.SubmitRequest:
        request = api.dryrun(api.load_job(spec, {}), "local", auto_resume=auto_resume)
        made.append(request)
        return request

    yield make
    for request in made:
        request.backend.close()


@pytest.mark.parametrize("auto_resume, watch, detach, where", [
    (True, None, False, api.HERE),          # auto-resume watches in the foreground by default
    (False, None, False, api.NOWHERE),      # plain submit: nobody watches
    (False, True, False, api.HERE),         # --watch without auto-resume
    (True, False, False, api.DETACHED),     # --no-watch --auto-resume: a detached watcher resumes it
    (True, None, True, api.DETACHED),       # --detach --auto-resume
    (False, True, True, api.NOWHERE),       # --watch --detach: detach wins, and nothing would resume it
])
def test_the_watcher_runs_where_the_flags_and_auto_resume_say(request_for, auto_resume, watch, detach, where):
    place = api.place_watcher(request_for(auto_resume), watch=watch, detach=detach)
    assert place.where == where and place.environment == {}


def test_in_cluster_on_a_backend_without_a_watcher_of_its_own_is_refused_by_name(request_for):
    with pytest.raises(OptionError) as refused:
        api.place_watcher(request_for(True), in_cluster=True)
    assert "--in-cluster" in refused.value.message and "runs no watcher of its own" in refused.value.message
    assert "drop --in-cluster" in (refused.value.hint or "")


def test_a_run_nobody_will_watch_says_how_to_attach_one():
    notes = api.start_watcher("lonely", api.WatcherPlace(api.NOWHERE))
    assert notes == ["nothing will resume lonely if it fails (no watcher runs): `wmctl watch lonely --auto-resume` "
                     "starts one; `wmctl status lonely` shows where it stands"]
    assert api.start_watcher("lonely", api.WatcherPlace(api.HERE)) == []
