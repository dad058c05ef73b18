"""`wmctl describe`'s resume entries say whether the resume was exact and, when not, why."""

from __future__ import annotations

from orchestrator.timeline import _progress_detail


def test_a_resume_not_exact_says_why():
    detail = _progress_detail({"event": "resume", "step": 10, "path": "/c/step-00000010", "exact": False,
                               "reason": "unregistered DataLoader"})
    assert detail == "resumed from step 10 (/c/step-00000010, not exact: unregistered DataLoader)"


def test_an_exact_resume_and_one_that_says_nothing_stay_as_they_were():
    assert _progress_detail({"event": "resume", "step": 10, "path": "/c", "exact": True}) == \
        "resumed from step 10 (/c, exact)"
    assert _progress_detail({"event": "resume", "step": 10}) == "resumed from step 10"
