"""``regen bench``: did the draft help, per source and per load?

The same held-out prompts go to a baseline and a speculative SGLang server at several
concurrency levels; the bench reports throughput, latency, the speedup and where it crosses 1,
acceptance length per source, the speculative flags (checked as ``verify-server`` does) and
verdicts in plain words. ``regen plan --reweight bench.json`` turns the per-source acceptance
into the next round's per-source limits. Modules, one job each:

    prompts    the holdout.jsonl format, reading it, N per source
    servers    /server_info flags check and the running acceptance
    load       one level against one server (aiohttp, the client's streaming path)
    runner     the whole run: model, flags, warm-up, levels, the per-source pass
    stats      percentiles, level stats, acceptance (per request or /server_info), crossover
    summary    the run → bench.json's report, with verdicts
    verdicts   the findings in words
    report     bench.json's schema (versioned), read and write
    records    requests.jsonl
    html       bench.html (plotly, inlined)
    console    the rich tables and the progress bar
    reweight   the next round's per-source limits, as a manifest overlay

Output directory (``--out``, default ``RUN_DIR/bench`` or ``./bench``)::

    OUT/
      bench.json       the report (regen.bench.report; schema_version 1)
      bench.html       the page with both plots (regen.bench.html; works offline)
      requests.jsonl   one line per request sent (regen.bench.records)
"""
