"""``hil explore``: a property-based search (hypothesis) over engine geometry x workload.

Each example is a geometry (``harness.geometry``: context, batch, chunk, pool, batch TKV
limit, prefix caching) and a workload (requests of chosen shapes: prompt lengths on and beside
block and chunk edges, max_tokens, arrivals, aborts, shared prefixes), run on a real engine and
judged by every check the suites use (``judge.py``). A failed example is shrunk to a minimal one,
replayed on fresh engines to confirm it (``confirm.py``; else it is flaky) and written as a
finding with a pytest regression test (``findings.py``).

    example.py     the example as data: geometry values, request shapes, JSON, the Scenario
    strategies.py  the hypothesis strategies: geometries and workloads, edges first
    judge.py       every verdict of one example (the one place a new check joins)
    runner.py      one example on the session's engines: rejected, passed or failed
    search.py      the search: one geometry at a time, its engine reused, the budget, shrinking
    confirm.py     a finding replayed on fresh engines: confirmed, or flaky; the Finding
    known.py       the conditions of the known failures quarantine.toml lists for the explorer
    findings.py    findings.md and the regression tests
    replay.py      what a regression test runs
    session.py     its session, checked and built the one way (``harness.session.build``);
                   the variants and tensor-parallel sizes it runs here
    command.py     the ``hil explore`` command, its input checked before anything runs
"""
