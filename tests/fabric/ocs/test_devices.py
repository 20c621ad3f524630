"""devices.yaml: the bundled example matches its topology; bad files name file, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.ocs.devices import devices_from_mapping, load_devices, open_device
from orchestrl.fabric.topology import load_topology

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GOOD = {"host": "127.0.0.1", "port": 3082, "ports": 320, "profile": "mems-3d"}


def test_the_64gpu_example_covers_every_device_of_its_topology(monkeypatch):
    monkeypatch.setenv("OCS_PASSWORD", "admin")  # the example reads the emulators' password from the environment
    topo = load_topology(EXAMPLES / "topology-64gpu-h800.yaml")
    devices = load_devices(EXAMPLES / "devices-64gpu.yaml", topo)
    assert set(devices) == {"core0", "pod0/agg0", "pod1/agg0"} == set(topo.devices)
    core = devices["core0"]
    assert (core.ports, core.profile, core.switch_delay_s, core.user) == (320, "mems-3d", 0.01, "admin")
    drv = open_device(devices["pod1/agg0"])
    assert (drv.name, drv.port, drv.ports, drv.switch_delay_s) == ("pod1/agg0", 3084, 320, 0.01)


def _write(tmp_path, doc) -> Path:
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("device, field, fix", [
    ({k: v for k, v in GOOD.items() if k != "host"}, "devices.core0.host", "required"),
    ({**GOOD, "profile": "mems"}, "devices.core0.profile", "rotor, mems-3d"),
    ({**GOOD, "port": 70000}, "devices.core0.port", "1 to 65535"),
    ({**GOOD, "ports": 400}, "devices.core0.ports", "1 to 320"),
    ({**GOOD, "prots": 4}, "devices.core0.prots", "not a known field"),
    ({**GOOD, "timeout_s": 0}, "devices.core0.timeout_s", "> 0"),
])
def test_a_bad_field_is_named_with_the_file_and_the_fix(tmp_path, device, field, fix):
    path = _write(tmp_path, {"devices": {"core0": device}})
    with pytest.raises(ConfigError) as info:
        load_devices(path)
    assert str(path) in str(info.value) and f"'{field}'" in str(info.value) and fix in str(info.value)


def test_defaults_fill_in_fields_and_the_password_may_come_from_the_environment(tmp_path, monkeypatch):
    doc = {"defaults": {"password_env": "OCS_TEST_PW", "profile": "rotor", "ports": 16},
           "devices": {"a": {"host": "h", "port": 1}, "b": {"host": "h", "port": 2, "password_env": "OCS_OWN_PW"}}}
    path = _write(tmp_path, doc)
    monkeypatch.setenv("OCS_OWN_PW", "own")
    with pytest.raises(ConfigError, match=r"'defaults.password_env'.*OCS_TEST_PW is not set.*export OCS_TEST_PW"):
        load_devices(path)
    monkeypatch.setenv("OCS_TEST_PW", "s3cret")
    devices = load_devices(path)
    assert devices["a"].password == "s3cret" and devices["b"].password == "own"
    assert "s3cret" not in repr(devices["a"])


def _secrets(tmp_path, doc, mode=0o600) -> Path:
    path = tmp_path / "secrets.yaml"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(mode)
    return path


def test_credentials_come_from_the_secrets_file_never_from_the_device_file(tmp_path):
    base = {"profile": "rotor", "ports": 16}
    with pytest.raises(ConfigError, match=r"'devices.core0.password'.*puts a password in the device file.*secrets file"):
        load_devices(_write(tmp_path, {"devices": {"core0": {**GOOD, "password": "x"}}}))
    _secrets(tmp_path, {"credentials": {"default": {"user": "admin", "password": "d3f"},
                                        "sonic": {"user": "ops", "password": "s0n"}}})
    doc = {"secrets": "secrets.yaml", "defaults": base,
           "devices": {"core0": {"host": "h", "port": 1}, "pod0/agg0": {"host": "h", "port": 2, "protocol": "gnmi",
                                                                         "credentials": "sonic"}}}
    devices = load_devices(_write(tmp_path, doc))
    assert (devices["core0"].user, devices["core0"].password, devices["core0"].protocol) == ("admin", "d3f", "tl1")
    assert (devices["pod0/agg0"].user, devices["pod0/agg0"].password) == ("ops", "s0n")
    assert type(open_device(devices["pod0/agg0"])).__name__ == "GnmiDriver"
    doc["devices"]["core0"]["credentials"] = "missing"
    with pytest.raises(ConfigError, match=r"'devices.core0.credentials'.*names 'missing'.*add credentials.missing"):
        load_devices(_write(tmp_path, doc))
    _secrets(tmp_path, {"credentials": {"default": {"user": "a", "password": "b"}}}, mode=0o644)
    with pytest.raises(ConfigError, match=r"readable by others \(mode 644\).*chmod 600"):
        load_devices(_write(tmp_path, {**doc, "devices": {"core0": {"host": "h", "port": 1}}}))


@pytest.mark.parametrize("device, field, fix", [
    ({**GOOD, "protocol": "snmp"}, "devices.core0.protocol", "tl1, netconf, gnmi"),
    ({**GOOD, "protocol": "netconf", "transport": "tcp"}, "devices.core0.transport", "ssh"),
    ({**GOOD, "protocol": "gnmi", "transport": "grpc+tls"}, "devices.core0.tls_ca", "PEM file"),
    ({**GOOD, "protocol": "netconf", "datastore": "startup"}, "devices.core0.datastore", "auto, running, candidate"),
])
def test_a_bad_protocol_setting_is_named(tmp_path, device, field, fix):
    with pytest.raises(ConfigError) as info:
        load_devices(_write(tmp_path, {"devices": {"core0": device}}))
    assert f"'{field}'" in str(info.value) and fix in str(info.value), str(info.value)


def test_a_topology_device_missing_or_mismatched_is_refused(tmp_path):
    topo = load_topology(EXAMPLES / "topology-64gpu-h800.yaml")
    path = _write(tmp_path, {"devices": {"core0": GOOD}})
    with pytest.raises(ConfigError, match=r"no entry for device 'pod0/agg0'.*add entries for pod0/agg0, pod1/agg0"):
        load_devices(path, topo)
    small = {name: {**GOOD, "port": 3082 + i, "ports": 128, "profile": "rotor"} for i, name in enumerate(topo.devices)}
    with pytest.raises(ConfigError, match=r"'devices.core0.ports'.*fewer than the topology's radix 320"):
        load_devices(_write(tmp_path, {"devices": small}), topo)
    other = {name: {**GOOD, "port": 3082 + i, "profile": "piezo"} for i, name in enumerate(topo.devices)}
    with pytest.raises(ConfigError, match=r"'devices.core0.profile'.*technology 'mems-3d'"):
        load_devices(_write(tmp_path, {"devices": other}), topo)


def test_an_empty_device_list_is_refused():
    with pytest.raises(ConfigError, match="'devices': is empty"):
        devices_from_mapping({"devices": {}}, "d.yaml")


def test_two_devices_at_one_address_or_a_device_outside_the_topology_are_refused(tmp_path):
    topo = load_topology(EXAMPLES / "topology-64gpu-h800.yaml")
    both = {name: {**GOOD, "port": 3082 + i} for i, name in enumerate(topo.devices)}
    both["pod1/agg0"]["port"] = 3082  # the same switch as core0: each would undo the other's circuits
    with pytest.raises(ConfigError, match=r"'devices.pod1/agg0.port'.*127.0.0.1:3082 is also the address of device "
                                          r"'core0'"):
        load_devices(_write(tmp_path, {"devices": both}))
    extra = {**{name: {**GOOD, "port": 3082 + i} for i, name in enumerate(topo.devices)},
             "pod9/agg0": {**GOOD, "port": 4000}}
    with pytest.raises(ConfigError, match=r"'devices.pod9/agg0'.*not a device of topology"):
        load_devices(_write(tmp_path, {"devices": extra}), topo)


def test_one_switch_under_two_names_is_refused_by_resolved_address():
    """Issue 28.4: localhost:3182 and 127.0.0.1:3182 are one switch."""
    doc = {"devices": {"core0": {"host": "localhost", "port": 3182, "ports": 16, "profile": "rotor"},
                       "pod0/agg0": {"host": "127.0.0.1", "port": 3182, "ports": 16, "profile": "rotor"}}}
    with pytest.raises(ConfigError, match=r"both resolve to 127\.0\.0\.1:3182: one switch under two names"):
        devices_from_mapping(doc)
