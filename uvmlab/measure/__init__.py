"""What did a real run measure? The GPU path (``gpu``: shim, balloon, runner, worker), Nsight Systems exports
(``nsys``) and measured-vs-simulated comparison (``compare``, which returns data; ``uvmlab.report`` draws it).
Must not import ``uvmlab.advise``, ``uvmlab.report`` or the CLI."""
