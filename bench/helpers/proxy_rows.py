"""The control proxy's fault and load rows of ``bench/proxy.py`` (issue 28): each against a same-run reference.

* **partial failure**: every switch applies only 2 pairs of a bulk (and of the rollback's); the time
  from the 503 until journal and switches agree again once the fault is gone, against the audit
  period (the repair needs one read-back);
* **in doubt**: one switch answers after its timeout; the 503's answer time against the stated bound
  ``(S + 1) x (timeout_s + switch_delay_s)``, and the time until the read-back settled it;
* **slow clients**: ``/healthz`` latency under 300 half-sent request heads, from one address on
  ``--listen`` and from 20 addresses on ``--admin-listen``, against the same probes with no load;
* **committing load**: 32 jobs on the 2,048-GPU example (10 emulated switches), every period a
  commit (two plans alternate); commits/s and decision latency, against the remembered-plan rate
  (the same jobs re-announcing an unchanged plan) and against the safe window the gate predicted.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import httpx
import yaml

from orchestrl.agents.lab import EmulatedFabric

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY_64 = REPO / "examples" / "topology-64gpu-h800.yaml"
TOPOLOGY_2048 = REPO / "examples" / "topology-2048gpu.yaml"
INTENTS = REPO / "examples" / "intents"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _call(http: httpx.Client, method: str, path: str, body: object = None) -> tuple[int, object]:
    try:
        r = http.request(method, path, json=body)
    except httpx.TransportError as exc:
        return 0, str(exc)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def _journal(op: httpx.Client, topology) -> dict:
    from orchestrl.fabric.ocs.model import duplex_to_cross_connects

    out: dict = {d: {} for d in topology.devices}
    for job in _call(op, "GET", "/v1/plan")[1].get("jobs", {}).values():
        for c in (job.get("plan") or {}).get("circuits", []):
            out[c["device"]].update(duplex_to_cross_connects(c["a_port"], c["b_port"],
                                                             topology.devices[c["device"]].radix_ports))
    return out


def _until(check, timeout_s: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def _one_job(lab: EmulatedFabric, *extra: str) -> tuple[httpx.Client, httpx.Client, float]:
    lab.start_proxy("--reset", *extra)
    op = httpx.Client(base_url=lab.proxy.url, timeout=60, headers={"Authorization": f"Bearer {lab.operator_token}"})
    token = _call(op, "POST", "/v1/jobs", {"job": "rl", "gpus": "0-63"})[1]["token"]
    job = httpx.Client(base_url=lab.proxy.url, timeout=60, headers={"Authorization": f"Bearer {token}"})
    events, t = [], 100.0
    for _ in range(6):
        events += [{"kind": "start", "t_s": t, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
                   {"kind": "end", "t_s": t + 0.002, "stage": "train", "primitive": "all-to-all", "communicator": "ep"}]
        t += 0.052
    _call(job, "POST", "/v1/jobs/rl/events", {"events": events})
    body = {**yaml.safe_load((INTENTS / "train-fwd-bwd.yaml").read_text()), "job": "rl", "t_s": t - 0.05}
    status, doc = _call(job, "POST", "/v1/jobs/rl/intents", body)
    assert status == 200 and doc["decision"] == "commit", doc
    return op, job, t


def _sync(job: httpx.Client, t: float) -> tuple[int, object, float]:
    _call(job, "POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t, "window_hint_s": 60}]})
    body = {**yaml.safe_load((INTENTS / "weight-sync.yaml").read_text()), "job": "rl", "t_s": t}
    started = time.monotonic()
    status, doc = _call(job, "POST", "/v1/jobs/rl/intents", body)
    return status, doc, time.monotonic() - started


def bench_partial(lab: EmulatedFabric, work: Path, trials: int) -> dict:
    """Time to agreement after a partial bulk failure, once the fault is gone, against the audit period."""
    out: dict = {"trials": trials, "agree_s": [], "differ_after_answer": [], "said_half_changed": 0, "answers": []}
    period = 1.0
    if True:  # the caller's switches (instant switching), a fresh state file per trial
        for k in range(trials):
            lab.state_path = work / f"partial-{k}.db"
            op, job, t = _one_job(lab, "--audit-period", str(period))
            for name in lab.switches:
                lab.control(name).partial_bulk(2)
            status, doc, _ = _sync(job, t + 1)
            differ = sum(len(set(a.items()) ^ set(_journal(op, lab.topology)[d].items()))
                         for d, a in lab.tables().items())
            out["answers"].append(status)
            out["differ_after_answer"].append(differ)
            out["said_half_changed"] += int(isinstance(doc, dict) and "may be half-changed" in doc.get("reason", ""))
            for name in lab.switches:
                lab.control(name).partial_bulk(None)
            took = _until(lambda: lab.tables() == _journal(op, lab.topology), 30)
            out["agree_s"].append(float("inf") if took is None else took)
            op.close()
            job.close()
            lab.proxy.stop()
    out["period_s"] = period
    out["agree_max_s"] = max(out["agree_s"])
    return out


def bench_doubt(work: Path, trials: int, timeout_s: float = 1.0) -> dict:
    """The in-doubt answer time against the stated bound, and the time until the read-back settled it."""
    out: dict = {"trials": trials, "answer_s": [], "in_doubt": 0, "settle_s": [], "timeout_s": timeout_s}
    with EmulatedFabric(TOPOLOGY_64, work / "doubt", profile="test", timeout_s=timeout_s) as lab:
        lab.start_switches()
        for k in range(trials):
            lab.state_path = work / f"doubt-{k}.db"
            op, job, t = _one_job(lab, "--audit-period", "0.2")
            lab.control("pod0/agg0").delay_replies(1500 * timeout_s)
            status, doc, took = _sync(job, t + 1)
            out["answer_s"].append(took)
            out["in_doubt"] += int(status == 503 and "in doubt" in str(doc))
            lab.control("pod0/agg0").delay_replies(0)
            settled = _until(lambda: _call(op, "GET", "/healthz")[0] == 200
                             and lab.tables() == _journal(op, lab.topology), 30)
            out["settle_s"].append(float("inf") if settled is None else settled)
            op.close()
            job.close()
            lab.proxy.stop()
    out["bound_s"] = 4 * timeout_s  # (S + 1) round trips, S <= 3 steps, no switching delay (profile test)
    out["answer_max_s"] = max(out["answer_s"])
    return out


def _half_open(url: str, count: int, sources: list[str]) -> list[socket.socket]:
    host, port = re.match(r"https?://([^:/]+):(\d+)", url).groups()
    held = []
    for i in range(count):
        s = socket.socket()
        try:
            s.bind((sources[i % len(sources)], 0))
            s.settimeout(2)
            s.connect((host, int(port)))
            s.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer x")
        except OSError:
            s.close()
            continue
        held.append(s)
    return held


def _probe(url: str, n: int) -> dict:
    times, codes = [], []
    for _ in range(n):
        started = time.monotonic()
        try:
            codes.append(httpx.get(url + "/healthz", timeout=15).status_code)
        except httpx.TransportError:
            codes.append(0)
        times.append(time.monotonic() - started)
    return {"p50_s": _pct(times, 0.5), "p99_s": _pct(times, 0.99), "ok": sum(c == 200 for c in codes), "n": n}


def bench_slow_clients(lab: EmulatedFabric, work: Path, probes: int) -> dict:
    """Health under 300 half-sent heads (one address on --listen; 20 addresses, probed on both listeners)."""
    lab.state_path = work / "slow.db"
    if True:  # the caller's switches
        proxy = lab.start_proxy("--reset", "--admin-listen", "127.0.0.1:0")
        admin = next(m.group(1) for line in proxy.output if (m := re.search(r"operator listener on (\S+)", line)))
        out = {"quiet": _probe(proxy.url, probes)}
        held = _half_open(proxy.url, 300, ["127.0.0.2"])
        time.sleep(0.3)
        out["one_address"] = {**_probe(proxy.url, probes), "held": len(held)}
        for s in held:
            s.close()
        held = _half_open(proxy.url, 300, [f"127.0.0.{k}" for k in range(2, 22)])
        time.sleep(0.3)
        out["many_addresses_admin"] = {**_probe(admin, probes), "held": len(held)}
        # the main listener too: a probe that sends its request at once takes a stalled head's slot
        out["many_addresses_listen"] = {**_probe(proxy.url, probes), "held": len(held)}
        for s in held:
            s.close()
        lab.proxy.stop()
    return out


def _load_intent(job: str, gpus: str, variant: int, t: float) -> dict:
    """Two train periods whose plans differ: an EP all-to-all across the job's two ToRs, and one inside servers."""
    colls = [{"primitive": "all-to-all", "over": "ep", "bytes_per_rank": 2e9}] if variant % 2 == 0 else \
        [{"primitive": "all-reduce", "over": "tp", "bytes_per_rank": 1e9}]
    return {"job": job, "stage": "train", "period": "fwd-bwd" if variant % 2 == 0 else "grad-sync", "t_s": t,
            "layout": {"tp": 1, "ep": 4, "dp": 64, "pp": 1, "gpus": gpus}, "collectives": colls}


def bench_commit_load(work: Path, seconds: float, jobs_n: int = 32) -> dict:
    """32 jobs on 2,048 GPUs, each committing every period, against the remembered-plan rate and the safe window."""
    from orchestrl.fabric.topology import load_topology

    topo = load_topology(TOPOLOGY_2048)
    pairs = [(f"pod{p}/tor{r}", f"pod{p}/tor{r + 1}") for p in range(8) for r in range(0, 8, 2)][:jobs_n]
    out: dict = {}
    with EmulatedFabric(TOPOLOGY_2048, work / "load", profile="test") as lab:
        lab.start_switches()
        lab.start_proxy("--reset", "--max-connections-per-client", "256")
        op = httpx.Client(base_url=lab.proxy.url, timeout=60, headers={"Authorization": f"Bearer {lab.operator_token}"})
        jobs = {}
        for k, tors in enumerate(pairs):
            gpus = ",".join(str(g) for g in range(topo.gpu_count) if topo.tor_of_gpu(g) in tors)
            jobs[f"j{k}"] = (gpus, _call(op, "POST", "/v1/jobs", {"job": f"j{k}", "gpus": gpus})[1]["token"])
            warm = [e for w in range(6) for e in (  # the gate trusts a boundary kind's slack after 5 windows
                {"kind": "start", "t_s": 50 + 0.052 * w, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
                {"kind": "end", "t_s": 50.002 + 0.052 * w, "stage": "train", "primitive": "all-to-all",
                 "communicator": "ep"})]
            with httpx.Client(base_url=lab.proxy.url, timeout=60,
                              headers={"Authorization": f"Bearer {jobs[f'j{k}'][1]}"}) as c:
                _call(c, "POST", f"/v1/jobs/j{k}/events", {"events": warm})
        for mode in ("committing", "remembered"):
            lat: list[float] = []
            windows: list[float] = []
            late: list[float] = []
            switched_late: list[float] = []  # the proxy's realised late_s of every commit (intent or retried)
            retried: dict[str, int] = {}
            queued: list[float] = []
            decisions: dict[str, int] = {}
            stop = time.monotonic() + seconds
            lock = threading.Lock()

            def run(job: str, gpus: str, token: str) -> None:
                c = httpx.Client(base_url=lab.proxy.url, timeout=60, headers={"Authorization": f"Bearer {token}"})
                t, variant = 100.0 + (1000.0 if mode == "remembered" else 0.0), 0
                while time.monotonic() < stop:
                    ev = [{"kind": "start", "t_s": t, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
                          {"kind": "end", "t_s": t + 0.002, "stage": "train", "primitive": "all-to-all",
                           "communicator": "ep"}]
                    _, evdoc = _call(c, "POST", f"/v1/jobs/{job}/events", {"events": ev})
                    with lock:  # a deferred plan retried at the window this event opened
                        for d in (evdoc.get("decisions", []) if isinstance(evdoc, dict) else []):
                            retried[d["decision"]] = retried.get(d["decision"], 0) + 1
                            if d["decision"] == "commit" and d.get("late_s"):
                                switched_late.append(d["late_s"])
                    started = time.monotonic()
                    status, doc = _call(c, "POST", f"/v1/jobs/{job}/intents", _load_intent(job, gpus, variant, t + 0.002))
                    took = time.monotonic() - started
                    with lock:
                        key = doc.get("decision", str(status)) if isinstance(doc, dict) else str(status)
                        decisions[key] = decisions.get(key, 0) + 1
                        if key in ("commit", "unchanged"):
                            lat.append(took)
                            if doc.get("window_s") is not None:
                                windows.append(doc["window_s"])
                                # realised: the answer (devices switched) came after the window the job asked in
                                if key == "commit" and took > doc["window_s"] + doc.get("queued_s", 0.0):
                                    late.append(took)
                        if key == "commit" and doc.get("late_s"):
                            switched_late.append(doc["late_s"])
                        if isinstance(doc, dict) and doc.get("queued_s") is not None:
                            queued.append(doc["queued_s"])
                    t += 0.052
                    variant += 1 if mode == "committing" else 0
                c.close()
            threads = [threading.Thread(target=run, args=(j, g, tok)) for j, (g, tok) in jobs.items()]
            started = time.monotonic()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.monotonic() - started
            out[mode] = {"decisions": decisions, "per_s": len(lat) / wall, "commits_per_s": decisions.get("commit", 0) / wall,
                         "retried": retried, "retry_commits_per_s": retried.get("commit", 0) / wall,
                         "p50_s": _pct(lat, 0.5), "p99_s": _pct(lat, 0.99), "window_p50_s": _pct(windows, 0.5),
                         "late_commits": len(late), "switched_late": len(switched_late),
                         "switched_late_max_s": max(switched_late, default=0.0), "queued_p50_s": _pct(queued, 0.5), "queued_p99_s": _pct(queued, 0.99)}
        op.close()
        lab.proxy.stop()
    out["jobs"] = len(pairs)
    out["devices"] = len(topo.devices)
    return out
