"""``orchestrl sim jigsaw A B``: a user's own pair of pipelines on shared GPUs, against veRL, RollMux and MuxServe."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from orchestrl.agents.cli import main
from orchestrl.agents.cli.cmd_sim_jigsaw import parse_pipeline

SMALL = ["sim", "jigsaw", "Qwen3-0.6B/gsm8k", "Qwen3-0.6B/math", "--steps", "1", "--gpus", "4"]


def test_a_pair_prints_every_system_against_verl_and_the_layout_chosen(capsys):
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    for name in ("veRL (", "RollMux", "JigsawRL-MuxServe", "JigsawRL layout:", "memory violations: 0"):
        assert name in out, out
    verl = next(line for line in out.splitlines() if line.strip().startswith("veRL ("))
    assert verl.split()[-2] == "1.000"  # the baseline row is the ratio's denominator
    # every system at its own rollout TP degree: on 4 GPUs each pipeline's half is 2, so 1 and 2 are searched, and
    # the degree printed is the one the run (same input, --json) reports for that system
    assert "rollout TP searched: 1, 2" in out, out
    assert main(SMALL + ["--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    names = {"RollMux": "rollmux", "JigsawRL-MuxServe": "muxserve", "JigsawRL": "jigsaw"}
    table = [m.groups() for m in re.finditer(r"^\s+(\S+(?: \(\w+\))?)\s+\d+\s+\d\.\d{3}\s+(\d+)$", out, re.M)]
    assert len(table) == 4, out
    for name, deg in table:
        assert int(deg) == res["tp"]["verl" if name.startswith("veRL") else names[name]], (name, deg, res["tp"])
    assert out.count("its step alone on all the GPUs") == 2  # each pipeline's latency against its step alone


def test_json_has_the_numbers_the_table_is_made_of(capsys):
    assert main(SMALL + ["--json", "--systems", "jigsaw"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["routing"] in ("uniform", "halves", "split")
    assert res["jigsaw_tps"] > 0 and res["verl_tps"] > 0 and "rollmux_tps" not in res  # only what was asked
    assert set(res["jigsaw_latency_s"]) == set(res["exclusive_step_s"]) and len(res["exclusive_step_s"]) == 2


def test_a_pipeline_with_options_parses():
    assert parse_pipeline("Llama-3.1-8B/gsm8k-mt,scale=0.7") == ("Llama-3.1-8B", "gsm8k-mt", 1, 0.7)
    assert parse_pipeline("Qwen3-4B/aime, tp=2") == ("Qwen3-4B", "aime", 2, 1.0)


@pytest.mark.parametrize("argv,field", [
    (["Qwen3-4B", "Qwen3-0.6B/gsm8k"], "pipeline A"),
    (["Qwen3-4B/aim", "Qwen3-0.6B/gsm8k"], "task"),
    (["Qwen4/aime", "Qwen3-0.6B/gsm8k"], "bundled model"),
    (["Qwen3-4B/aime,tp=x", "Qwen3-0.6B/gsm8k"], "tp"),
    (["Qwen3-4B/aime,scale=0", "Qwen3-0.6B/gsm8k"], "scale"),
    (["Qwen3-4B/aime,foo=1", "Qwen3-0.6B/gsm8k"], "unknown option"),
    (["Qwen3-4B/aime,tp=2", "Qwen3-0.6B/gsm8k"], "same tp"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--gpus", "5"], "--gpus"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--gpus", "128"], "--gpus"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--steps", "0"], "--steps"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--systems", "foo"], "--systems"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--gpu", "B300"], "bundled GPU"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--gpu", "compute_sched/specs/gpus/h100.yaml"], "bundled GPU"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--steady", "--steps", "20"], "--steps"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--tp", "3"], "--tp"),  # 8 GPUs are not two halves of TP-3 workers
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--tp", "1,0"], "--tp"),
    (["Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--tp", "two"], "--tp"),
])
def test_bad_input_is_refused_naming_what_is_wrong_before_simulating(argv, field, capsys):
    assert main(["sim", "jigsaw", *argv]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and "simulating" not in err, err


def test_the_command_runs_from_a_shell():
    proc = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", *SMALL], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "JigsawRL layout:" in proc.stdout and "simulating" in proc.stderr  # progress on stderr, result on stdout


def test_steady_state_runs_the_shorter_pipeline_more_steps_and_veRL_split_finishes_its_halves_together(capsys):
    # Qwen3-0.6B/MATH's steps are longer than GSM8K's: GSM8K runs more of them while MATH runs its steps 4 times
    assert main(SMALL + ["--steady", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    gsm, math_ = res["steady_passes"]
    assert math_ == 4 and gsm > 4 and res["left_out"] == []
    # RollMux's best here is each job in a group of its own, where GSM8K runs all its steps at its own pace (in one
    # group its round robin would hold GSM8K to MATH's 4: tests/sim/test_jigsaw.py)
    assert res["rollmux_config"].startswith("isolated groups") and res["rollmux_steps_run"] == [res["steps"] * p for p in (gsm, math_)]
    assert "bound_tps" not in res  # the chain bound is a makespan bound, not one on the steady measure
    alone = list(res["exclusive_step_s"].values())
    assert gsm / math_ == pytest.approx(alone[1] / alone[0], rel=0.35)  # about as many more as its steps are shorter
    assert res["jigsaw_tps"] > 0 and res["memory_violations"] == 0
    # what each job gets against its split rate, beside the sum: the two add back up to the system's throughput
    for key in ("jigsaw", "muxserve", "rollmux"):
        per = res[f"{key}_per_pipeline_vs_split"]
        assert sum(x * r for x, r in zip(per, res["verl_split_rates_tps"])) == pytest.approx(res[f"{key}_tps"], rel=1e-9)
    main(SMALL + ["--steady", "--systems", "verl"])
    out = capsys.readouterr().out
    assert "steady state: the pipelines run" in out and "upper bound" not in out
    main(SMALL + ["--steady"])
    out = capsys.readouterr().out
    assert "against its own on veRL split's half: RollMux A " in out and "; JigsawRL-MuxServe A " in out
    assert "RollMux (isolated groups, each job alone on its half: rollout on 1 of 2, 1 of 2) runs 8 and 4 steps" in out


def test_steady_and_long_run_together_are_refused_by_the_parser_naming_both(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sim", "jigsaw", "Qwen3-4B/aime", "Qwen3-0.6B/gsm8k", "--steady", "--long-run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--steady" in err and "--long-run" in err and "simulating" not in err
