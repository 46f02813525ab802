"""Which memory policy makes this job fastest? The policy catalogue (``policies``), job-shape policies (``shape``)
and the advisor (``advisor``: ranks the policies; ``resolve_policy`` turns a named policy into the run's
``RunConfig.applied``, the only place a run's policy is looked up). Built on ``uvmlab.uvm`` and ``uvmlab.sim``;
nothing below ``uvmlab.run`` imports it."""
