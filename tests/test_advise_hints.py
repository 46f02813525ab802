"""The per-tensor hint policies in the advisor: ranked rows with their code change, composable with others."""

from __future__ import annotations

from uvmlab.advise.advisor import advise
from uvmlab.advise.policies import HINT_POLICIES, compose, get_policy
from uvmlab.config import RunConfig, WorkloadConfig

SMALL = WorkloadConfig("alexnet", batch_size=16, options={"image_size": 64, "num_classes": 10}, iterations=2)
HINTS = [p.name for p in HINT_POLICIES]


def test_hint_policies_are_ranked_rows_with_the_lines_that_apply_them() -> None:
    adv = advise(RunConfig(workload=SMALL, oversub=1.5, mode="sim"), policies=["pca-on", *HINTS], combine=False)
    rows = adv.rows.set_index("policy")
    assert set(HINTS) <= set(rows.index)
    for name in HINTS:
        row = rows.loc[name]
        assert row["outcome"] == "ok" and row["rank"] >= 1
        assert "cudaMem" in row["needs_code_change"]  # the calls a user adds
        assert row["peak_resident_bytes"] <= adv.available_bytes
    # each hint changes the simulated run (none is silently the job as given)
    given = rows.loc["pca-on"]
    for name in HINTS:
        assert rows.loc[name]["iteration_time_ns"] != given["iteration_time_ns"], name


def test_hints_compose_with_each_other_and_with_driver_policies_but_discard_needs_pca() -> None:
    both = get_policy("remote-optimizer-state+discard-freed-blocks")
    assert both.sim_options == {"advise_remote": "optimizer_state", "discard_min_bytes": 1 << 20}
    assert get_policy("prefetch-next-kernel+driver-prefetch-aggressive").sim_options["prefetch_threshold"] == 1
    import pytest

    from uvmlab.errors import InputError

    with pytest.raises(InputError, match="PCA"):
        compose([get_policy("pca-off"), get_policy("discard-freed-blocks")])


def test_different_hints_can_be_combined_by_the_advisor() -> None:
    """Two hints act on different tensors or events: the advisor pairs them (one family would keep only one)."""
    from uvmlab.advise.advisor import _combinations

    singles = {"remote-optimizer-state": 1.0, "discard-freed-blocks": 1.1, "prefetch-next-kernel": 5.0}
    combos = _combinations(singles, {"iteration_time_ns": 2.0})
    assert ("remote-optimizer-state", "discard-freed-blocks") in combos
    assert all("prefetch-next-kernel" not in c for c in combos)  # not better than the job as given


def test_offload_and_remote_optimizer_state_do_not_combine() -> None:
    """Offload takes the optimizer state off the device: remote advice on it would be a row equal to offload alone."""
    import pytest

    from uvmlab.advise.advisor import _combinations
    from uvmlab.errors import InputError

    with pytest.raises(InputError, match="nothing is left to advise"):
        compose([get_policy("offload-optimizer"), get_policy("remote-optimizer-state")])
    combos = _combinations({"remote-optimizer-state": 1.0, "offload-optimizer": 1.2}, {"iteration_time_ns": 2.0})
    assert combos == []


def test_discard_rows_say_their_gain_is_an_upper_bound() -> None:
    adv = advise(RunConfig(workload=SMALL, oversub=1.5, mode="sim"), policies=["discard-freed-blocks"], combine=False)
    row = adv.rows.set_index("policy").loc["discard-freed-blocks"]
    assert row["evidence"] == "upper bound"  # the evidence column (issue 28), with the assumption as a caveat
    assert any("one remap fault per 64 KiB page" in c for c in row["caveats"])
