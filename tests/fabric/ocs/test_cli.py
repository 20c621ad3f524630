"""``orchestrl ocs ...`` against a real emulator subprocess."""

from __future__ import annotations

import json

import yaml

from orchestrl.agents.cli import main

from .conftest import N


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["ocs", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_connect_list_status_disconnect(emulator, control, capsys):
    dev = ["--device", f"{emulator.host}:{emulator.port}"]
    code, out, _ = _run(capsys, "connect", *dev, "1,17", "2,18")
    assert code == 0 and out.splitlines() == ["1 -> 17  ok", "2 -> 18  ok"]
    code, out, _ = _run(capsys, "list", *dev, "--json")
    assert json.loads(out) == {"1": 17, "2": 18}
    control.fail_ports([5], alarm="LOS")
    code, out, _ = _run(capsys, "status", *dev)
    assert out.split() == ["5", "failed", "LOS", "(-60.00", "dBm)"]  # read as Polatis clients do: RTRV-PORT-POWER
    code, out, _ = _run(capsys, "disconnect", *dev, "17", "2")
    assert out.splitlines() == ["removed 1 -> 17", "removed 2 -> 18"]


def test_duplex_circuits_by_device_name(emulator, control, capsys, tmp_path):
    devices = tmp_path / "devices.yaml"
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(yaml.safe_dump({"credentials": {"default": {"user": "admin", "password": "admin"}}}))
    secrets.chmod(0o600)
    devices.write_text(yaml.safe_dump({"secrets": "secrets.yaml", "devices": {"pod0/agg0": {
        "host": emulator.host, "port": emulator.port, "ports": N, "profile": "rotor"}}}))
    dev = ["--device", "pod0/agg0", "--devices", str(devices)]
    code, out, _ = _run(capsys, "connect", *dev, "--duplex", "1,2")
    assert code == 0 and out.splitlines() == [f"1 -> {N + 2}  ok", f"2 -> {N + 1}  ok"]
    _run(capsys, "disconnect", *dev, "2")
    code, out, _ = _run(capsys, "list", *dev, "--duplex")
    assert out.splitlines() == [f"1 -> {N + 2}  (half circuit: reverse missing)"]


def test_a_refused_connect_is_one_line_with_exit_status_2(emulator, control, capsys):
    dev = ["--device", f"{emulator.host}:{emulator.port}"]
    _run(capsys, "connect", *dev, "1,17")
    code, _, err = _run(capsys, "connect", *dev, "1,18")
    assert code == 2 and err.startswith("orchestrl: error: OCS") and "SAAL" in err and len(err.splitlines()) == 1
    code, out, _ = _run(capsys, "connect", *dev, "--mode", "continue", "1,18", "3,19")
    assert code == 1 and out.splitlines()[0].startswith("1 -> 18  SAAL")


def test_bad_addresses_and_profiles_are_named(capsys):
    code, _, err = _run(capsys, "list", "--device", "nowhere")
    assert code == 2 and "'nowhere' is not HOST:PORT" in err
    code, _, err = _run(capsys, "emulate", "--listen", "127.0.0.1:0", "--profile", "warp")
    assert code == 2 and "unknown profile 'warp'" in err and "mems-3d" in err
