"""What will UVM do to this job? The simulated run (``simulate``), cost-model fits from measurements
(``calibrate``: from an nsys export; ``profile_fit``: a per-GPU profile from end-to-end timings) and the seed
study's published numbers (``study``, validation targets only). Built on ``uvmlab.sim``, ``uvmlab.trace`` and
``uvmlab.memory``; must not import ``uvmlab.advise`` (a policy arrives resolved in the ``RunConfig``), the report or
the CLI."""
