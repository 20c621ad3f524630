"""Where the sim commands write and whom they ask: checked before the work, and results never lost to a write.

* ``--out`` (figures) and ``--plot`` (``sim run``) are checked before any simulation: a folder that
  is an existing file, or that cannot be created, is refused with the option, the path and the fix
  (exit status 2), in about a second instead of after the sweep.
* A write that fails after the work (here: the folder replaced by a file while the sweep ran, as a
  race or a full disk would) still prints the table or JSON, then names what was not written
  (exit status 1).
* ``--ray HOST:PORT`` with nothing listening is refused at once instead of waiting forever in
  ``ray.init``. Only loopback is ever connected to.
* ``sim figure --help`` lists every registered figure with a line on what it shows.
* ``sim run`` names the part of a step that is running while it lasts.

The ``sim run`` cases use the TEST FIXTURE stages of ``tests/sim/stage_fixtures.py`` (fabric,
controller, weight sync and cost are real); the figures run their real ``--quick`` cases.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrl.sim.run

from orchestrl import sim
from orchestrl.agents.cli import main
from orchestrl.agents.cli.cmd_sim import _FIGURES
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.experiments import fig13, fig18
from orchestrl.sim.experiments.rowsplot import figure_main as rows_figure_main
from orchestrl.sim.sweep import check_ray_address
from tests.sim.stage_fixtures import fixture_stages

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "sim" / "demo-64gpu.yaml"


def _small_run(tmp_path: Path, prompts: int = 8) -> Path:
    """The bundled demo with a short step, copied elsewhere (so its topology path must resolve)."""
    text = DEMO.read_text().replace("prompts_per_step: 32", f"prompts_per_step: {prompts}")
    text = text.replace("topology: ../topology-64gpu-h800.yaml",
                        f"topology: {REPO / 'examples' / 'topology-64gpu-h800.yaml'}")
    text = text.replace("policy: orchestrl", "policy: verl-to")
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def _free_loopback_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*argv: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


# ------------------------------------------------------------------ --out / --plot before the work


@pytest.mark.parametrize("figure", ["fig13", "fig18"])  # fig13's command line (also fig14, fig16) and rowsplot's
def test_out_that_is_an_existing_file_is_refused_before_the_sweep(figure, tmp_path, capsys):
    taken = tmp_path / "results"
    taken.write_text("not a folder")
    assert main(["sim", "figure", figure, "--quick", "--out", str(taken)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"field '--out': the folder '{taken}' is an existing file" in err
    assert "(allowed: a folder this user can write to" in err
    assert f"[{figure}]" not in err  # no case ran: the sweep reports progress per case
    inside = taken / "sub"
    assert main(["sim", "figure", figure, "--quick", "--out", str(inside)]) == 2
    assert f"field '--out': the folder '{inside}' is inside {taken}, which is an existing file" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc (a folder nobody can create in)")
def test_out_that_cannot_be_created_exits_2_without_a_traceback():
    proc = _cli("sim", "figure", "fig13", "--quick", "--out", "/proc/nope")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert "field '--out': cannot create the folder '/proc/nope'" in proc.stderr
    assert "[fig13]" not in proc.stderr


def test_a_missing_out_folder_is_created_and_written(tmp_path, capsys):
    out = tmp_path / "new" / "figs"
    assert main(["sim", "figure", "fig18", "--quick", "--json", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["figure"] == "fig18"
    assert (out / "fig18.csv").stat().st_size > 0
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the write check left nothing


@pytest.fixture
def fixtures(monkeypatch):
    monkeypatch.setattr(sim.run, "default_stages", fixture_stages)


def test_plot_in_a_missing_folder_is_written_there(fixtures, tmp_path, capsys):
    png = tmp_path / "nonexistent" / "dir" / "x.png"
    assert main(["sim", "run", str(_small_run(tmp_path)), "--iterations", "1", "--plot", str(png)]) == 0
    assert png.stat().st_size > 0 and png.with_suffix(".csv").stat().st_size > 0


def test_plot_under_a_file_or_onto_a_folder_is_refused_before_simulating(fixtures, tmp_path, capsys):
    run = str(_small_run(tmp_path))
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    assert main(["sim", "run", run, "--plot", str(blocker / "x.png")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"field '--plot': '{blocker / 'x.png'}': the folder '{blocker}' is an existing file" in err
    assert "[sim run] [" not in err  # refused before the first iteration
    (tmp_path / "taken.png").mkdir()
    assert main(["sim", "run", run, "--plot", str(tmp_path / "taken.png")]) == 2
    assert "is a folder, so taken.png cannot be written" in capsys.readouterr().err


# ------------------------------------------------------------------ a write that fails after the work


def _replace_by_file(folder: Path) -> None:
    """What a race or a full disk does to the output after the check passed: the folder is gone."""
    shutil.rmtree(folder)
    folder.write_text("the folder was replaced while the sweep ran")


def test_fig13_prints_its_json_before_a_failing_write_and_names_the_files(tmp_path, capsys):
    out = tmp_path / "figs"

    def one_case_then_lose_the_folder(**kwargs):  # a real case of the sweep (FT, 57B MoE, 512 GPUs, quick)
        results = fig13.sweep([fig13.RLCase("57b-moe", 512, "ft", train_gpus=256, quick=True)], workers=1)
        _replace_by_file(out)
        return [], results

    rc = fig13.figure_main("fig13", "t", "x FT", (), one_case_then_lose_the_folder, fig13.plot,
                           ["--json", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert rc == 1
    assert json.loads(stdout)["figure"] == "fig13"  # the results are out
    msg = next(ln for ln in err.splitlines() if ln.startswith("orchestrl: error:"))
    assert "field '--out': could not write" in msg and str(out / "fig13.csv") in msg and str(out / "fig13.png") in msg
    assert "the results printed above are complete" in msg


def test_rowsplot_figures_print_their_table_before_a_failing_write(tmp_path, capsys):
    out = tmp_path / "figs"

    def sweep_then_lose_the_folder(quick, workers, ray, seeds=1):
        results = fig18.sweep(quick, workers, ray, seeds)
        _replace_by_file(out)
        return results

    rc = rows_figure_main(fig18.FIGURE.cli, sweep_then_lose_the_folder, fig18.rows_of, ["--quick", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert rc == 1
    assert stdout.startswith(fig18.FIGURE.cli.heading) and len(stdout.splitlines()) > 3
    msg = next(ln for ln in err.splitlines() if ln.startswith("orchestrl: error:"))
    assert f"field '--out': could not write {out} (" in msg and str(out / "fig18.csv") in msg


def test_sim_run_prints_its_result_before_a_failing_plot(fixtures, tmp_path, capsys, monkeypatch):
    out = tmp_path / "plots"
    real = sim.run.simulate

    def simulate_then_lose_the_folder(*args, **kwargs):
        result = real(*args, **kwargs)
        _replace_by_file(out)
        return result

    monkeypatch.setattr(sim.run, "simulate", simulate_then_lose_the_folder)
    rc = main(["sim", "run", str(_small_run(tmp_path)), "--iterations", "1", "--json", "--plot", str(out / "t.png")])
    stdout, err = capsys.readouterr()
    assert rc == 1 and json.loads(stdout)["samples_per_s"] > 0
    assert f"field '--plot': could not write {out / 't.csv'}" in err and str(out / "t.png") in err


# ------------------------------------------------------------------ --ray


@pytest.mark.parametrize("figure", ["fig14", "fig18"])
def test_ray_address_with_nothing_listening_is_refused_at_once(figure):
    address = f"127.0.0.1:{_free_loopback_port()}"
    proc = _cli("sim", "figure", figure, "--quick", "--ray", address, timeout=60)  # before: ray.init waited forever
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert f"field '--ray': no Ray cluster answers at {address}" in proc.stderr
    assert "ray start --head" in proc.stderr and "--ray local" in proc.stderr


def test_run_sweep_probes_its_ray_address_before_ray_init():
    pytest.importorskip("ray")
    address = f"127.0.0.1:{_free_loopback_port()}"
    code = ("from orchestrl.sim.sweep import run_sweep\nfrom orchestrl.fabric.errors import ConfigError\n"
            f"try:\n    run_sweep(abs, [-1], backend='ray', ray_address={address!r})\n"
            "except ConfigError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert f"sweep: field 'ray_address': no Ray cluster answers at {address}" in proc.stdout, proc.stderr


def test_ray_addresses_that_are_not_host_port_are_refused_and_a_listening_one_passes():
    for bad in ("head-node", "ray://", "127.0.0.1:notaport"):
        with pytest.raises(ConfigError, match="is not HOST:PORT"):
            check_ray_address(bad)
    for left_to_ray in (None, "local", "auto"):
        check_ray_address(left_to_ray)
    with socket.socket() as server:  # something listening on loopback passes the probe
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        check_ray_address(f"127.0.0.1:{port}")
        check_ray_address(f"ray://127.0.0.1:{port}")


# ------------------------------------------------------------------ --help


def test_figure_help_lists_every_figure_with_its_section(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sim", "figure", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    exp = REPO / "sim" / "experiments"
    modules = sorted(p.stem for pat in ("fig[0-9]*.py", "jigsaw_fig*.py", "rollart_*.py") for p in exp.glob(pat)
                     if not p.stem.endswith("_common"))
    assert sorted(_FIGURES) == sorted(m.replace("_", "-") for m in modules)  # every figure module is a command
    for name, (module, _) in _FIGURES.items():
        line = next((ln for ln in text.splitlines() if ln.startswith(f"  {name}  ")), None)
        assert line is not None, f"{name} is not described in --help"
        first = __import__(module, fromlist=["_"]).__doc__.splitlines()[0]  # "OrchestrRL §7.2.1, Figure 13: ..."
        section = re.match(r"(?:OrchestrRL|JigsawRL|RollArt) (.+?)(?:, Figure \d+)?:", first).group(1)
        assert section in line, (name, section, line)


# ------------------------------------------------------------------ progress inside a step


def test_sim_run_names_the_running_part_of_a_step_while_it_lasts(fixtures, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ORCHESTRL_PROGRESS_EVERY_S", "0.01")
    assert main(["sim", "run", str(_small_run(tmp_path, prompts=8)), "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    assert "2 iteration(s), 64 responses per step" in err.splitlines()[0]
    beats = re.findall(r"^\[sim run\] step (\d)/2: (.+?): running for [\d.]+ s$", err, re.M)
    assert beats and {part for _, part in beats} <= {"building the step's length trace", "generation", "training",
                                                     "weight sync"}
    assert {step for step, _ in beats} <= {"1", "2"}


def test_a_progress_period_that_is_not_a_number_is_refused_by_name(fixtures, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ORCHESTRL_PROGRESS_EVERY_S", "ten")
    assert main(["sim", "run", str(_small_run(tmp_path, prompts=8))]) == 2
    err = capsys.readouterr().err
    assert "ORCHESTRL_PROGRESS_EVERY_S" in err and "'ten'" in err and "Traceback" not in err


def test_figure_takes_seeds_and_reports_each_row_over_them(tmp_path, capsys):
    # the README's reproduction commands use `sim figure NAME --seeds N`; the top-level parser passes it on
    assert main(["sim", "figure", "fig18", "--quick", "--seeds", "2", "--json", "--out", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(r["seeds"] == 2 for r in rows)


def test_figure_refuses_zero_seeds_naming_the_option(tmp_path, capsys):
    assert main(["sim", "figure", "fig18", "--quick", "--seeds", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--seeds" in err and "Traceback" not in err
