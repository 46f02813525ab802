"""Published per-GPU peak memory of named fine-tuning jobs against uvmlab's estimate (nothing fitted).

    python benchmarks/llm_published.py [ROW_ID ...]

Prints one Markdown row per measurement (uvmlab.evaluate.llm_published): the source, what was measured, the value,
uvmlab's figure of the same kind, the error and the time. The captures are cached (UVMLAB_CACHE); a cold run takes
about a minute a row on one core.
"""

from __future__ import annotations

import sys
import time

from uvmlab.evaluate.llm_published import evaluate, rows


def main(argv: list[str]) -> None:
    selected = [r for r in rows() if not argv or r.row_id in argv]
    t0 = time.perf_counter()
    results = evaluate(selected, progress=lambda rid: print(f"... {rid}", file=sys.stderr, flush=True))
    print("| row | GPU | measured (kind) | uvmlab | error | uvmlab verdict | s |")
    print("|---|---|---|---|---|---|---|")
    errors = []
    for r in results:
        m = r.row.measured_bytes
        measured = "OOM" if m is None else f"{m / 1e9:.2f} GB"
        err = r.error
        if err is not None:
            errors.append(abs(err))
        verdict = "fits" if r.fits else "OOM"
        ok = "" if m is not None or not r.fits else " (should not fit)"
        print(
            f"| {r.row.row_id} | {r.row.gpu}{'/' + r.row.gpu_memory if r.row.gpu_memory else ''} | {measured} "
            f"({r.row.metric}) | {r.estimated_bytes / 1e9:.2f} GB | "
            f"{'n/a' if err is None else f'{err:+.1%}'} | {verdict}{ok} | {r.seconds:.0f} |"
        )
    if errors:
        errors.sort()
        print(
            f"\nrows with a value: {len(errors)}; median |error| {errors[len(errors) // 2]:.1%}, "
            f"max {errors[-1]:.1%}; wall {time.perf_counter() - t0:.0f} s"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
