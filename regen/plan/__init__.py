"""The plan: which samples a run does and in what order.

- :mod:`regen.plan.report`: the numbers of ``regen plan``, before anything is sent;
- :mod:`regen.plan.index`: the planned stream, and the plan index written from it;
- :mod:`regen.plan.bodies`: planned samples read back from the index;
- :mod:`regen.plan.select`: one session's work, from the index;
- :mod:`regen.plan.attempts`: which stored samples get a new attempt;
- :mod:`regen.plan.session`: the session's plan (plan.json) and its queue;
- :mod:`regen.plan.packed`: the planned stream's item forms.
"""
