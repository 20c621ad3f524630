"""The phase runtime with real job processes over HTTP: round-robin order, crash/hang isolation, warm starts."""

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from orchestrl.agents.phase import PhaseRuntime, PhaseServer  # noqa: E402
from orchestrl.fabric.errors import ConfigError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    t_start = time.perf_counter()
    import torch
    from orchestrl.agents.phase import PhaseRuntime, cold_load
    job, url, iterations, behaviour, out, ckpt = sys.argv[1:7]
    t0 = time.perf_counter()
    state = cold_load(ckpt)                       # cold: from disk, page cache dropped
    cold_load_s = time.perf_counter() - t0
    cold_start_s = time.perf_counter() - t_start  # cold: new process, torch import, load
    rt = PhaseRuntime(job, url, state, acquire_timeout_s=60)

    @rt.phase("rollout")
    def rollout(ctx, i):
        if behaviour == f"crash:rollout:{{i}}":
            os._exit(3)
        ctx.report_progress(0.5)
        time.sleep(0.05)
        ctx.state["w"].add_(1)                    # the update must survive offload and warm start

    @rt.phase("train")
    def train(ctx, i):
        if behaviour == f"hang:train:{{i}}":
            time.sleep(600)
        time.sleep(0.05)

    for i in range(int(iterations)):
        rollout(i)
        train(i)
    rt.finish()
    with open(out, "w") as f:
        json.dump({{"cold_load_s": cold_load_s, "cold_start_s": cold_start_s, "warm_s": rt.warm_start_s,
                   "w": float(rt.host["w"][0])}}, f)
""")


def _start_jobs(tmp_path, url, jobs, iterations, behaviour=None, state_mb=16):
    script = tmp_path / "job.py"
    script.write_text(JOB.format(repo=str(REPO)))
    procs = {}
    for job in jobs:
        ckpt = tmp_path / f"{job}.pt"
        torch.save({"w": torch.zeros(state_mb * 2 ** 18)}, ckpt)
        procs[job] = subprocess.Popen([sys.executable, str(script), job, url, str(iterations),
                                       (behaviour or {}).get(job, "-"), str(tmp_path / f"{job}.json"), str(ckpt)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return procs


def _wait(procs, timeout_s=50):
    out = {}
    for job, p in procs.items():
        try:
            out[job] = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()  # only processes this test started
            out[job] = None
    return out


def test_jobs_in_separate_processes_run_in_round_robin_order_with_warm_starts(tmp_path):
    order = ["a", "b", "c"]
    with PhaseServer(order, {j: [0] for j in order}, permit_timeout_s=30) as server:
        procs = _start_jobs(tmp_path, server.url, order, iterations=3)
        codes = _wait(procs)
        state = server.state()
    assert codes == {"a": 0, "b": 0, "c": 0}, {j: p.stderr.read() for j, p in procs.items()}
    for phase in ("rollout", "train"):
        assert [j for j, ph in state["grants"] if ph == phase] == order * 3
    assert state["finished"] == order and not state["failed"]
    results = {j: json.loads((tmp_path / f"{j}.json").read_text()) for j in order}
    assert all(r["w"] == 3.0 for r in results.values())  # state carried across warm starts
    warm = statistics.median(s for r in results.values() for s in r["warm_s"][1:])
    cold_load = statistics.median(r["cold_load_s"] for r in results.values())
    cold_start = statistics.median(r["cold_start_s"] for r in results.values())
    print(f"\nwarm start {warm * 1e3:.2f} ms; cold load from disk {cold_load * 1e3:.1f} ms "
          f"({cold_load / warm:.1f}x); cold process start {cold_start * 1e3:.0f} ms ({cold_start / warm:.0f}x)")
    assert warm < cold_load < cold_start


def test_a_crashed_job_and_a_hung_job_lose_their_permits_and_the_others_finish(tmp_path):
    order = ["a", "b", "c"]
    with PhaseServer(order, {j: [0] for j in order}, permit_timeout_s=2.0, turn_timeout_s=20.0) as server:
        procs = _start_jobs(tmp_path, server.url, order, iterations=4,
                            behaviour={"b": "crash:rollout:1", "c": "hang:train:1"})
        codes = _wait({"a": procs["a"], "b": procs["b"]})
        state = server.state()
        procs["c"].kill()
        procs["c"].wait(timeout=10)
    assert codes["a"] == 0 and codes["b"] == 3
    assert set(state["failed"]) == {"b", "c"} and all("expired" in why for why in state["failed"].values())
    assert state["finished"] == ["a"]
    trains = [j for j, ph in state["grants"] if ph == "train"]
    assert trains[:3] == order and trains.count("a") == 4 and trains.count("b") == 1
    assert json.loads((tmp_path / "a.json").read_text())["w"] == 4.0


def test_phase_names_and_unknown_jobs_are_refused():
    with PhaseServer(["a"], {"a": [0]}, permit_timeout_s=5) as server:
        rt = PhaseRuntime("zzz", server.url, {"w": torch.zeros(4)})
        with pytest.raises(ConfigError, match="phase"):
            rt.phase("sync")

        @rt.phase("train")
        def step(ctx):
            return 1

        with pytest.raises(ConfigError, match="unknown job"):
            step()
        assert server.state()["grants"] == []


def test_orchestrl_groups_serve_hands_out_permits_to_a_client():
    from orchestrl.agents.phase import PhaseClient

    proc = subprocess.Popen([sys.executable, "-m", "orchestrl.agents.cli", "groups", "serve", "--job", "a:0", "--job", "b:0"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), line
        a, b = PhaseClient(url, "a"), PhaseClient(url, "b")
        pa = a.acquire("rollout", timeout_s=10)
        a.release(pa["permit_id"])
        assert b.acquire("rollout", timeout_s=10)["job_id"] == "b"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert json.loads(proc.stderr.read().strip().splitlines()[-1])["grants"] == [["a", "rollout"], ["b", "rollout"]]


def test_the_runtime_hook_triggers_long_tail_migration_so_the_next_rollout_starts_early():
    import threading

    with PhaseServer(["a", "b"], {"a": [0], "b": [0]}, permit_timeout_s=30, tail_threshold=0.8) as server:
        a = PhaseRuntime("a", server.url, {"w": torch.zeros(8)})
        b = PhaseRuntime("b", server.url, {"w": torch.zeros(8)})
        a.runtime_hook(lambda: 0.9)  # 90% of a's responses are done: its tail is all that is left
        b_started = threading.Event()
        seen = []

        @a.phase("rollout")
        def a_rollout(ctx):
            seen.append(ctx.migrate.wait(20))  # the scheduler asked to consolidate the tail...
            seen.append(b_started.wait(20))  # ...and b's rollout started on the freed GPUs meanwhile

        @b.phase("rollout")
        def b_rollout(ctx):
            b_started.set()

        first = threading.Thread(target=a_rollout)
        first.start()
        for _ in range(2000):
            if server.state()["grants"]:
                break
            threading.Event().wait(0.01)
        b_rollout()
        first.join(20)
        assert seen == [True, True]
        assert server.state()["grants"] == [["a", "rollout"], ["b", "rollout"]] and not server.state()["failed"]


def test_warm_start_is_timed_until_the_copies_land_not_until_they_are_queued(monkeypatch):
    """On CUDA the host-to-device copies are non_blocking: they return when queued. The warm-start time
    must include waiting for them, so the clock is read only after the device is synchronised."""
    import time

    import orchestrl.agents.phase as phase

    log = []
    real = time.perf_counter
    landing_s = 0.05

    def device_still_copying():  # what a queue of non_blocking copies leaves behind: the data lands later
        time.sleep(landing_s)
        log.append("sync")

    with PhaseServer(["a"], {"a": [0]}, permit_timeout_s=30) as server:
        rt = PhaseRuntime("a", server.url, {"w": torch.zeros(1024)}, device="cpu")
        assert rt._synchronize is phase._no_sync  # on CPU the copy is synchronous: nothing to wait for
        rt._synchronize = device_still_copying

        @rt.phase("rollout")
        def rollout(ctx):
            return float(ctx.state["w"].sum())

        def clock():  # only warm_start's reads: the HTTP client and server read the same clock on other threads
            if sys._getframe(1).f_code.co_name == "warm_start":
                log.append("clock")
            return real()
        monkeypatch.setattr(phase.time, "perf_counter", clock)
        assert rollout() == 0.0
        monkeypatch.undo()
    assert log[:3] == ["clock", "sync", "clock"]  # start, wait for the copies, then read the clock
    assert rt.warm_start_s[0] >= landing_s
