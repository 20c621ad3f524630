"""Every bad input of issue 17 gets a 4xx naming the field (HTTP) or one line and exit status 2 (CLI), never a 500 or a traceback."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
import yaml

from orchestrl.agents.cli import main
from tests.agents.conftest import EXAMPLES, TOPOLOGY_64, Api, intent


def _register(op: Api, job: str, gpus: str) -> Api:
    status, doc = op.call("POST", "/v1/jobs", {"job": job, "gpus": gpus})
    assert status == 201, doc
    return Api(op.url, doc["token"])


def test_hostile_bodies_get_4xx_naming_the_field(lab, operator):
    a = _register(operator, "job-a", "0-31")
    cases = [
        (operator, "/v1/jobs", {"job": "x", "gpus": "0-99999999999"}, 422, "gpus"),  # was MemoryError
        (operator, "/v1/jobs", {"job": "", "gpus": [0]}, 422, "job"),
        (operator, "/v1/jobs", {"job": "j" * 100_000, "gpus": [0]}, 422, "job"),
        (a, "/v1/jobs/job-a/intents", {**intent("train-fwd-bwd.yaml", job="job-a"),
                                       "layout": {"tp": 1, "gpus": "0-30000000"}}, 422, "layout.gpus"),
        (a, "/v1/jobs/job-a/intents", {"stage": "train", "collectives": [
            {"primitive": "all-reduce", "groups": [[0, 1]], "bytes_per_rank": 1e300}]}, 422, "bytes_per_rank"),
        (a, "/v1/jobs/job-a/events", {"events": [{"kind": "start", "t_s": 1, "seq": -1}]}, 422, "events[0].seq"),
    ]
    for api, path, body, want, field in cases:
        started = time.monotonic()
        status, doc = api.call("POST", path, body)
        assert status == want and field in (doc["field"] or "") + doc["reason"], (path, body if len(
            json.dumps(body)) < 300 else "...", status, doc)
        assert time.monotonic() - started < 5, f"{path}: {time.monotonic() - started:.1f} s"
    # 2,000 nested arrays (was RecursionError -> 500)
    status, doc = a.call("POST", "/v1/jobs/job-a/events", raw=b'{"events": ' + b"[" * 2000 + b"]" * 2000 + b"}")
    assert status == 400 and doc["field"] == "body" and "nests" in doc["reason"], doc
    status, doc = a.call("POST", "/v1/jobs/job-a/intents", raw=b'{"stage": "train", "stage": "gen", "collectives": []}')
    assert status == 400 and "twice" in doc["reason"], doc
    status, doc = a.call("POST", "/v1/jobs/job-a/events", raw=b'{"events": [{"kind": "start", "t_s": NaN}]}')
    assert status == 400 and doc["field"] == "body", doc
    assert Api(lab.proxy.url).call("GET", "/healthz")[0] == 200
    assert "Traceback" not in "\n".join(lab.proxy.output)


def _raw(url: str, data: bytes, timeout_s: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(data)
        return s.recv(65536)


def test_the_token_is_checked_before_a_body_is_read(lab):
    started = time.monotonic()
    head = (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n")  # announces a megabyte and sends none of it
    answer = _raw(lab.proxy.url, head)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert time.monotonic() - started < 3
    answer = _raw(lab.proxy.url, head.replace(b"Content-Length: 1000000", b"Content-Length: 100000000")
                  .replace(b"Host: x", b"Host: x\r\nAuthorization: Bearer " + lab.operator_token.encode()))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_idle_connections_are_capped_and_timed_out_and_hold_no_threads(tmp_path):
    from orchestrl.agents.lab import EmulatedFabric

    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        lab.start_switches()
        proxy = lab.start_proxy("--max-connections", "64", "--header-timeout", "1")
        host, port = proxy.url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
        threads = int(next(line.split()[1] for line in open(f"/proc/{proxy.process.pid}/status")
                           if line.startswith("Threads:")))
        assert threads < 40, f"{threads} threads for 300 idle connections"
        time.sleep(1.5)
        closed = 0
        for s in idle:  # the proxy closed every connection that sent no request within the timeout
            s.settimeout(2)  # (those over the per-client cap were answered 503 and closed at once)
            try:
                got = s.recv(4096)
                if got.startswith(b"HTTP/1.1 503"):
                    got = s.recv(1)
                closed += got == b""
            except (ConnectionResetError, socket.timeout):
                closed += 1
            s.close()
        assert closed == len(idle)
        assert Api(proxy.url).call("GET", "/healthz")[0] == 200


def _cli(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refusals
        code = exc.code
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("kind", ["topology", "intent", "allocate", "devices", "tokens"])
def test_a_config_file_with_non_utf8_bytes_is_refused_in_one_line(tmp_path, capsys, kind):
    bad = tmp_path / ("bad.json" if kind == "allocate" else "bad.yaml")
    bad.write_bytes(b"name: caf\xe9\n")
    argv = {"topology": ["fabric", "show", "--topology", str(bad)],
            "intent": ["fabric", "plan", "--topology", str(TOPOLOGY_64), "--intent", str(bad)],
            "allocate": ["fabric", "allocate", "--input", str(bad)],
            "devices": ["ocs", "list", "--device", "core0", "--devices", str(bad)],
            "tokens": ["proxy", "serve", "--topology", str(TOPOLOGY_64), "--devices", str(bad), "--tokens", str(bad),
                       "--state", str(tmp_path / "f.db")]}[kind]
    code, err = _cli(capsys, *argv)
    assert code == 2 and "not UTF-8" in err and str(bad) in err and "Traceback" not in err, err


def test_duplicate_keys_in_a_yaml_or_json_file_are_refused(tmp_path, capsys):
    doc = (EXAMPLES / "intents" / "train-fwd-bwd.yaml").read_text()
    twice = tmp_path / "twice.yaml"
    twice.write_text(doc.replace("stage: train\n", "stage: train\nstage: gen\n", 1))
    code, err = _cli(capsys, "fabric", "plan", "--topology", str(TOPOLOGY_64), "--intent", str(twice))
    assert code == 2 and "'stage' twice" in err, err
    problem = tmp_path / "p.json"
    problem.write_text('{"capacity": 4, "capacity": 8}')
    code, err = _cli(capsys, "fabric", "allocate", "--input", str(problem))
    assert code == 2 and "'capacity' appears twice" in err, err


def test_bad_command_line_numbers_are_refused_in_one_line(tmp_path, capsys):
    for argv, needle in [
        (["ocs", "list", "--device", "127.0.0.1:9", "--timeout", "-1"], "--timeout"),
        (["ocs", "emulate", "--ports", "0"], "--ports"),
        (["ocs", "emulate", "--drop-replies", "2"], "--drop-replies"),
        (["proxy", "serve", "--topology", "t", "--devices", "d", "--audit-period", "-1"], "--audit-period"),
    ]:
        code, err = _cli(capsys, *argv)
        assert code == 2 and needle in err and "Traceback" not in err, (argv, err)
    started = time.monotonic()
    code, err = _cli(capsys, "fabric", "cost", "--gpus", str(10 ** 12))
    assert code == 2 and "gpus" in err and time.monotonic() - started < 5, err


def test_emulate_on_a_port_in_use_is_refused_in_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, err = _cli(capsys, "ocs", "emulate", "--listen", f"127.0.0.1:{taken.getsockname()[1]}",
                         "--profile", "test", "--ports", "4")
    assert code == 2 and "--listen" in err and "in use" in err and "Traceback" not in err, err


def test_serve_on_a_port_in_use_is_refused_in_one_line(tmp_path):
    from orchestrl.agents.lab import EmulatedFabric

    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab, socket.socket() as taken:
        lab.start_switches()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RuntimeError) as err:
            lab.start_proxy("--listen", f"127.0.0.1:{taken.getsockname()[1]}")
        assert "--listen" in str(err.value) and "Traceback" not in str(err.value)
        assert not any(lab.tables().values())


def test_a_devices_file_naming_unknown_devices_or_one_address_twice_is_refused(tmp_path, capsys):
    topo_devices = yaml.safe_load((EXAMPLES / "devices-64gpu.yaml").read_text())
    doc = json.loads(json.dumps(topo_devices))
    doc["devices"]["pod7/agg0"] = dict(next(iter(doc["devices"].values())))
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump(doc))
    os.environ.setdefault("OCS_PASSWORD", "x")
    code, err = _cli(capsys, "proxy", "serve", "--topology", str(TOPOLOGY_64), "--devices", str(path),
                     "--state", str(tmp_path / "f.db"))
    assert code == 2 and ("pod7/agg0" in err) and "Traceback" not in err, err
