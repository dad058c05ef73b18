"""The followed-log cursor both engines' log followers share (orchestrator/backends/logcursor.py):
the runtimes stamp each stream's lines on their own, so a log is not in stamp order; a line is
dropped only if it was read already."""

from __future__ import annotations

from orchestrator.backends.logcursor import REORDER_WINDOW_NS, LogCursor, parse_rfc3339_ns, split_timestamp

S = 10**9


def test_a_line_stamped_before_one_already_read_is_still_new():
    """File order: a stderr note stamped at 1.0002 s, then a stdout progress line its copier
    stamped at 1.0001 s (moby daemon/logger/copier.go, containerd internal/cri/io/logger.go).
    Both are delivered; a reader keeping only lines newer than the newest lost the second."""
    cur = LogCursor()
    log = [(1 * S, "start"), (1 * S + 200_000, "wmctl: checkpoint x: resumed from another run"),
           (1 * S + 100_000, 'WMCTL-PROGRESS {"event": "resume", "step": 10}'), (2 * S, "step 11")]
    assert [t for s, t in log if cur.fresh(s, t)] == [t for _, t in log]
    assert cur.newest == 2 * S


def test_a_resumed_read_replays_nothing_and_misses_nothing_out_of_order():
    """The stream drops after the newest line; the engine is asked again from the window before
    it (resume_from_ns), which replays lines read and holds one written later with an older stamp."""
    cur = LogCursor()
    first = [(10 * S, "a"), (11 * S, "b"), (12 * S, "c")]
    assert [t for s, t in first if cur.fresh(s, t)] == ["a", "b", "c"]
    start = cur.resume_from_ns()
    assert start == 12 * S - REORDER_WINDOW_NS
    replay = [(s, t) for s, t in first if s >= start] + [(12 * S - 1000, "late stdout"), (13 * S, "d")]
    assert [t for s, t in replay if cur.fresh(s, t)] == ["late stdout", "d"]
    # the same text at another time is another line (a job printing the same thing twice)
    assert cur.fresh(14 * S, "d") and not cur.fresh(14 * S, "d")


def test_a_line_before_the_window_counts_as_read_and_memory_stays_bounded():
    cur = LogCursor()
    for i in range(10_000):
        assert cur.fresh(i * S // 10, f"line {i}")            # ten lines a second for 1,000 s
    assert not cur.fresh(0, "line 0")                         # replayed from long ago: read already
    assert not cur.fresh(0, "never read, but older than any reorder")
    kept = len(cur._read)
    assert kept <= REORDER_WINDOW_NS // (S // 10) + 2, kept  # the window's lines, not all 10,000


def test_lines_without_a_stamp_always_pass_and_stamps_parse_exactly():
    cur = LogCursor()
    assert cur.fresh(None, "x") and cur.fresh(None, "x") and cur.newest is None
    ten = parse_rfc3339_ns("2024-05-01T10:00:00Z")
    assert ten is not None
    assert split_timestamp("2024-05-01T10:00:00.000000001Z text\r") == (ten + 1,
                                                                        "text")
    assert split_timestamp("2024-05-01T12:00:00.5+02:00 t")[0] == parse_rfc3339_ns("2024-05-01T10:00:00.5Z")
    assert split_timestamp("12 monkeys and T") == (None, "12 monkeys and T")
