"""Engine and profile numbers have stated limits: an absurd ``--block-size``,
``--max-num-seqs``, ``--max-num-batched-tokens`` or ``profile show --batch`` is refused naming
the flag and its range, not blamed on the fit or the time limit."""

from __future__ import annotations

import pytest

from conftest import REPO, run_cli
from scepsy_common.errors import InputError
from scepsy_profile.serving import MAX_BATCHED_TOKENS, MAX_BLOCK_SIZE, MAX_NUM_SEQS, MemoryPolicy

D = REPO / "datasets"
PLAN = ["plan", "--workflow", str(D / "workflows" / "rag.yaml"), "--cluster",
        str(D / "clusters" / "a100-16.yaml"), "--target", "0.3", "--trace-requests", "50",
        "--quiet", "--time-limit", "20"]


@pytest.mark.parametrize("flag, most", [("--block-size", MAX_BLOCK_SIZE),
                                        ("--max-num-seqs", MAX_NUM_SEQS),
                                        ("--max-num-batched-tokens", MAX_BATCHED_TOKENS)])
def test_an_absurd_engine_flag_is_refused_naming_it_and_its_range(tmp_path, flag, most):
    out = tmp_path / "plan.json"
    code, _, err = run_cli(*PLAN, "--out", str(out), flag, str(most + 1))
    assert code == 2 and flag in err and f"1 to {most} " in err, err
    assert "infeasible" not in err and "time limit" not in err
    assert not out.exists()


@pytest.mark.parametrize("field, most", [("max_batch", MAX_NUM_SEQS),
                                         ("block_size", MAX_BLOCK_SIZE),
                                         ("max_num_batched_tokens", MAX_BATCHED_TOKENS)])
def test_the_memory_policy_holds_the_same_limits(field, most):
    assert getattr(MemoryPolicy(**{field: most}), field) == most
    with pytest.raises(InputError) as exc:
        MemoryPolicy(**{field: most + 1})
    assert exc.value.field == field and str(most) in exc.value.expected


def test_profile_show_refuses_a_batch_beyond_any_engine():
    show = ["profile", "show", "--model", "qwen2.5-7b", "--gpu", "A100-80GB", "--tp", "1",
            "--shares", "1"]
    code, out, err = run_cli(*show, "--batch", "1000000000000")
    assert code == 2 and out == "" and "--batch" in err and f"1 to {MAX_NUM_SEQS}" in err
    code, out, _ = run_cli(*show, "--batch", str(MAX_NUM_SEQS))
    assert code == 0 and out
