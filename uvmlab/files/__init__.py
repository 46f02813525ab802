"""The files uvmlab writes: atomic writes (``atomic``), run directories with their lock, marker and manifest
(``rundir``), and checks that an output never replaces an input or a file uvmlab did not write (``outputs``).
Imports nothing of uvmlab but ``uvmlab.errors`` and ``uvmlab.console``."""
