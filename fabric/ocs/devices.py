"""The device file (``devices.yaml``): where each OCS of the topology is reached, and how.

It maps topology device names (``core0``, ``pod0/agg0``) to a TL1 address, credentials, the
number of ports per side and the switching profile (OrchestrRL Table 2)::

    defaults:                 # optional; every field may also be set per device
      user: admin
      password_env: OCS_PASSWORD   # read the password from the environment (or: password: ...)
      timeout_s: 5
    devices:
      core0:     {host: 10.0.0.10, port: 3082, ports: 320, profile: mems-3d}
      pod0/agg0: {host: 10.0.0.11, port: 3082, ports: 320, profile: mems-3d}

Every refusal names the file, the field and the fix (:class:`fabric.errors.ConfigError`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.ocs.emulator import PROFILES

__all__ = ["DeviceConfig", "load_devices", "devices_from_mapping", "check_devices", "open_device"]

_FIELDS = {"host", "port", "user", "password", "password_env", "ports", "profile", "timeout_s"}


@dataclass(frozen=True)
class DeviceConfig:
    """How to reach one optical circuit switch."""

    name: str  # topology device name
    host: str
    port: int  # TCP port of the TL1 listener
    ports: int  # N ports per side (= the topology's duplex radix)
    profile: str  # switching technology, a key of fabric.ocs.emulator.PROFILES
    user: str = "admin"
    password: str = ""
    timeout_s: float = 5.0  # reply timeout; connects also wait the profile's switching delay

    @property
    def switch_delay_s(self) -> float:
        return PROFILES[self.profile][0]

    def __repr__(self) -> str:  # never print the password
        return (f"DeviceConfig(name={self.name!r}, host={self.host!r}, port={self.port}, ports={self.ports}, "
                f"profile={self.profile!r}, user={self.user!r})")


def _device(name: str, r: Reader, defaults: Reader) -> DeviceConfig:
    r.reject_unknown(_FIELDS)

    def pick(key: str, read: Callable[[Reader], Any]) -> Any:
        # Read the device's own field, else the default; a field missing in both is named on the device.
        return read(defaults if defaults.has(key) and not r.has(key) else r)

    profile = pick("profile", lambda s: s.str("profile", choices=PROFILES))
    radix = PROFILES[profile][1]
    for section in (r, defaults):
        if section.has("password") and section.has("password_env"):
            raise section.error("password", "is given together with password_env", "one of password, password_env")
    password = pick("password", lambda s: s.str("password", default=""))
    # A device's own password beats the defaults' password_env; its own password_env beats everything.
    source = r if r.has("password_env") else None if r.has("password") else defaults
    if source is not None and source.has("password_env"):
        var = source.str("password_env")
        if var not in os.environ:
            raise source.error("password_env", f"environment variable {var} is not set",
                               f"export {var}=..., or give 'password' instead")
        password = os.environ[var]
    host = pick("host", lambda s: s.str("host"))
    if not host.strip():
        raise r.error("host", "is empty", "a host name or IP address")
    return DeviceConfig(
        name=name, host=host, port=pick("port", lambda s: s.int("port", minimum=1, maximum=65535)),
        ports=pick("ports", lambda s: s.int("ports", minimum=1, maximum=radix)), profile=profile,
        user=pick("user", lambda s: s.str("user", default="admin")), password=password,
        timeout_s=pick("timeout_s", lambda s: s.float("timeout_s", default=5.0, minimum=0.0, exclusive_minimum=True)),
    )


def _from_reader(r: Reader) -> dict[str, DeviceConfig]:
    r.reject_unknown({"defaults", "devices"})
    defaults = r.section("defaults", default={})
    defaults.reject_unknown(_FIELDS)
    devices = r.section("devices")
    if not devices.data:
        raise r.error("devices", "is empty", "a mapping of device name -> {host, port, ports, profile}")
    out = {}
    for name in devices.data:
        if not isinstance(name, str) or not name:
            raise devices.error(str(name), "device names must be non-empty strings", "e.g. core0, pod0/agg0")
        out[name] = _device(name, devices.section(name), defaults)
    _check_unique_addresses(out, r.source)
    return out


def load_devices(path: str | os.PathLike[str], topology: Any = None) -> dict[str, DeviceConfig]:
    """Return ``{device name: DeviceConfig}`` from a device file, checked against ``topology`` if given.

    Raises
    ------
    ConfigError
        If the file or a field is malformed, or (with ``topology``) a topology device is missing
        or does not match.
    """
    devices = _from_reader(load_document(path))
    if topology is not None:
        check_devices(devices, topology, os.fspath(path))
    return devices


def devices_from_mapping(data: Mapping[str, Any], source: str = "<mapping>") -> dict[str, DeviceConfig]:
    """Return the devices of an already-parsed device document.

    Examples
    --------
    >>> d = devices_from_mapping({"devices": {"core0": {"host": "127.0.0.1", "port": 3082, "ports": 16,
    ...                                                 "profile": "rotor"}}})
    >>> d["core0"].switch_delay_s
    1e-05
    """
    return _from_reader(Reader(data, source))


def _resolved(host: str, port: int) -> set[tuple[str, int]]:
    """Every address ``host:port`` resolves to (the literal host when it does not resolve here)."""
    try:
        infos = socket.getaddrinfo(host.strip(), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return {(host.strip().lower(), port)}
    return {(info[4][0], port) for info in infos} | {(host.strip().lower(), port)}


def _check_unique_addresses(devices: Mapping[str, DeviceConfig], source: str) -> None:
    """Refuse two devices that reach one switch: the same ``host:port``, or names that resolve to one address."""
    seen: dict[tuple[str, int], str] = {}
    for name, cfg in devices.items():
        for key in sorted(_resolved(cfg.host, cfg.port)):
            other = seen.get(key)
            if other is not None and other != name:
                also = devices[other]
                literal = (also.host.strip().lower(), also.port) == (cfg.host.strip().lower(), cfg.port)
                same = f"{cfg.host}:{cfg.port} is also the address of device {other!r}" if literal else (
                    f"{cfg.host}:{cfg.port} and device {other!r}'s {also.host}:{also.port} both resolve to "
                    f"{key[0]}:{key[1]}: one switch under two names")
                raise ConfigError(source, f"devices.{name}.{'port' if literal else 'host'}", same,
                                  "one entry per switch (one host:port)")
            seen[key] = name


def check_devices(devices: Mapping[str, DeviceConfig], topology: Any, source: str) -> None:
    """Refuse a device file that does not cover ``topology`` (a :class:`fabric.topology.Topology`).

    Every topology device must be present, have at least its radix of ports per side, and use the
    topology's switching technology; a device the topology does not have is refused (a typo would
    otherwise leave a real switch unmanaged), and so are two devices at one ``host:port`` (one
    switch would be driven as two, each undoing the other's circuits).
    """
    unknown = sorted(set(devices) - set(topology.devices))
    if unknown:
        raise ConfigError(source, f"devices.{unknown[0]}", f"is not a device of topology {topology.name!r}",
                          f"remove it or fix its name (the topology has {', '.join(list(topology.devices)[:6])})")
    _check_unique_addresses(devices, source)
    for dev in topology.devices.values():
        if dev.id not in devices:
            missing = [d for d in topology.devices if d not in devices]
            raise ConfigError(source, "devices", f"has no entry for device {dev.id!r} of topology {topology.name!r}",
                              "add entries for " + ", ".join(missing))
        cfg = devices[dev.id]
        if cfg.ports < dev.radix_ports:
            raise ConfigError(source, f"devices.{dev.id}.ports", f"{cfg.ports} ports per side is fewer than the "
                                                                 f"topology's radix {dev.radix_ports}",
                              f">= {dev.radix_ports}")
        if cfg.profile not in (dev.technology.name, "test"):
            raise ConfigError(source, f"devices.{dev.id}.profile", f"{cfg.profile!r} differs from the topology's "
                                                                   f"technology {dev.technology.name!r}",
                              f"{dev.technology.name} (or test)")


def open_device(cfg: DeviceConfig, **overrides: Any):
    """Return a :class:`fabric.ocs.driver.Tl1Driver` for ``cfg`` (not yet connected).

    ``overrides`` replace driver arguments (``user``, ``password``, ``timeout_s``, ...).
    """
    from orchestrl.fabric.ocs.driver import Tl1Driver

    kwargs = {"name": cfg.name, "user": cfg.user, "password": cfg.password, "timeout_s": cfg.timeout_s,
              "ports": cfg.ports, "switch_delay_s": cfg.switch_delay_s, **overrides}
    return Tl1Driver(cfg.host, cfg.port, **kwargs)
