"""`wmctl plot`: the picture of a run. ``data`` turns kept progress events and the run record
into plot data (pure, no drawing library); ``text`` draws it as a terminal chart with no
dependency; ``image`` draws it to a file with matplotlib (the optional ``wmctl[plot]`` extra,
loaded through ``orchestrator.adaptors.matplotlib``)."""
