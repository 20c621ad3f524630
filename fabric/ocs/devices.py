"""The device file (``devices.yaml``): where each OCS of the topology is reached, in which protocol, and how.

It maps topology device names (``core0``, ``pod0/agg0``) to an address, the protocol (and so the
adapter, :mod:`fabric.ocs.adapter`), the number of ports per side and the switching profile
(OrchestrRL Table 2). Credentials never sit in it: they come from a secrets file (mode 0600,
:mod:`fabric.ocs.secrets`) that the device file names, or from an environment variable::

    secrets: secrets.yaml        # relative to this file; or pass --secrets
    defaults:                    # optional; every field may also be set per device
      protocol: tl1              # tl1 | netconf | gnmi
      timeout_s: 5
    devices:
      core0:     {host: 10.0.0.10, port: 3082, ports: 320, profile: mems-3d}
      pod0/agg0: {host: 10.0.0.11, port: 830,  ports: 320, profile: mems-3d, protocol: netconf}
      pod1/agg0: {host: 10.0.0.12, port: 8080, ports: 64,  profile: mems-3d, protocol: gnmi, credentials: sonic}

Every refusal names the file, the field and the fix (:class:`fabric.errors.ConfigError`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.ocs.errors import OcsRequestError
from orchestrl.fabric.ocs.adapter import PROTOCOLS, OcsAdapter
from orchestrl.fabric.ocs.device_core import PROFILES
from orchestrl.fabric.ocs.secrets import Secrets, load_secrets

__all__ = ["DeviceConfig", "load_devices", "devices_from_mapping", "check_devices", "open_device", "open_adapter"]

_FIELDS = {"host", "port", "user", "password_env", "credentials", "ports", "profile", "timeout_s", "protocol",
           "transport", "max_bulk", "los_dbm", "tls_ca", "ssh_known_hosts", "datastore", "confirm_timeout_s"}
_TRANSPORTS = {"tl1": ("tcp", "ssh"), "netconf": ("ssh",), "gnmi": ("grpc", "grpc+tls")}


@dataclass(frozen=True)
class DeviceConfig:
    """How to reach one optical circuit switch."""

    name: str  # topology device name
    host: str
    port: int  # TCP port of the switch's TL1 listener, NETCONF/SSH server or gNMI server
    ports: int  # N ports per side (= the topology's duplex radix)
    profile: str  # switching technology, a key of fabric.ocs.device_core.PROFILES
    user: str = "admin"
    password: str = ""  # from the secrets file or password_env, never from the device file
    timeout_s: float = 5.0  # reply timeout; connects also wait the profile's switching delay
    protocol: str = "tl1"  # tl1 | netconf | gnmi: the adapter (fabric.ocs.adapter)
    options: tuple[tuple[str, Any], ...] = ()  # the adapter's own settings (transport, max_bulk, tls_ca, ...)

    @property
    def switch_delay_s(self) -> float:
        return PROFILES[self.profile][0]

    def __repr__(self) -> str:  # never print the password
        return (f"DeviceConfig(name={self.name!r}, host={self.host!r}, port={self.port}, ports={self.ports}, "
                f"profile={self.profile!r}, protocol={self.protocol!r}, user={self.user!r})")


def _device(name: str, r: Reader, defaults: Reader, secrets: Secrets | None) -> DeviceConfig:
    for section in (r, defaults):
        if section.has("password"):
            raise section.error("password", "puts a password in the device file",
                                "move it to a secrets file (mode 0600) named by 'secrets:' at the top of this file "
                                "or by --secrets (docs/ocs.md), or give password_env")
    r.reject_unknown(_FIELDS)

    def pick(key: str, read: Callable[[Reader], Any]) -> Any:
        # Read the device's own field, else the default; a field missing in both is named on the device.
        return read(defaults if defaults.has(key) and not r.has(key) else r)

    profile = pick("profile", lambda s: s.str("profile", choices=PROFILES))
    radix = PROFILES[profile][1]
    protocol = pick("protocol", lambda s: s.str("protocol", default="tl1", choices=PROTOCOLS))
    user = pick("user", lambda s: s.str("user", default="admin"))
    password = ""
    source = r if r.has("password_env") else defaults if defaults.has("password_env") else None
    if source is not None:
        var = source.str("password_env")
        if var not in os.environ:
            raise source.error("password_env", f"environment variable {var} is not set",
                               f"export {var}=..., or put the password in the secrets file")
        password = os.environ[var]
    elif secrets is not None:
        named = pick("credentials", lambda s: s.str("credentials")) if r.has("credentials") or defaults.has(
            "credentials") else None
        creds = secrets.lookup(named, name, r.source)
        user, password = (r.str("user") if r.has("user") else creds.user), creds.password
    elif r.has("credentials") or defaults.has("credentials"):
        raise r.error("credentials", "names an entry of a secrets file, but no secrets file is given",
                      "'secrets: <path>' at the top of the device file, or --secrets")
    host = pick("host", lambda s: s.str("host"))
    if not host.strip():
        raise r.error("host", "is empty", "a host name or IP address")
    options: dict[str, Any] = {}
    transport = pick("transport", lambda s: s.str("transport", default=_TRANSPORTS[protocol][0],
                                                  choices=_TRANSPORTS[protocol]))
    if protocol == "tl1":
        options["transport"] = transport
    for key in ("tls_ca", "ssh_known_hosts", "datastore"):
        if r.has(key) or defaults.has(key):
            options[key] = pick(key, lambda s, k=key: s.str(k))
    if transport == "grpc+tls" and "tls_ca" not in options:
        raise r.error("tls_ca", "is required for transport grpc+tls", "the PEM file of the CA of the switch's certificate")
    if "datastore" in options and options["datastore"] not in ("auto", "running", "candidate"):
        raise r.error("datastore", f"{options['datastore']!r} is not a NETCONF datastore choice", "auto, running, candidate")
    for key in ("max_bulk", "confirm_timeout_s"):
        if r.has(key) or defaults.has(key):
            options[key] = pick(key, lambda s, k=key: s.int(k, minimum=0))
    if r.has("los_dbm") or defaults.has("los_dbm"):
        options["los_dbm"] = pick("los_dbm", lambda s: s.float("los_dbm", minimum=-100.0, maximum=30.0))
    return DeviceConfig(
        name=name, host=host, port=pick("port", lambda s: s.int("port", minimum=1, maximum=65535)),
        ports=pick("ports", lambda s: s.int("ports", minimum=1, maximum=radix)), profile=profile,
        user=user, password=password,
        timeout_s=pick("timeout_s", lambda s: s.float("timeout_s", default=5.0, minimum=0.0, exclusive_minimum=True)),
        protocol=protocol, options=tuple(sorted(options.items())),
    )


def _from_reader(r: Reader, secrets_path: str | os.PathLike[str] | None = None) -> dict[str, DeviceConfig]:
    r.reject_unknown({"defaults", "devices", "secrets"})
    defaults = r.section("defaults", default={})
    defaults.reject_unknown(_FIELDS | {"password"})
    secrets = None
    if secrets_path is None and r.has("secrets"):
        secrets_path = os.path.join(os.path.dirname(os.path.abspath(r.source)), r.str("secrets"))
    if secrets_path is not None:
        secrets = load_secrets(secrets_path)
    devices = r.section("devices")
    if not devices.data:
        raise r.error("devices", "is empty", "a mapping of device name -> {host, port, ports, profile}")
    out = {}
    for name in devices.data:
        if not isinstance(name, str) or not name:
            raise devices.error(str(name), "device names must be non-empty strings", "e.g. core0, pod0/agg0")
        out[name] = _device(name, devices.section(name), defaults, secrets)
    _check_unique_addresses(out, r.source)
    return out


def load_devices(path: str | os.PathLike[str], topology: Any = None, *,
                 secrets: str | os.PathLike[str] | None = None) -> dict[str, DeviceConfig]:
    """Return ``{device name: DeviceConfig}`` from a device file, checked against ``topology`` if given.

    ``secrets`` overrides the secrets file the device file names (``secrets:``).

    Raises
    ------
    ConfigError
        If the file or a field is malformed, or (with ``topology``) a topology device is missing
        or does not match.
    """
    devices = _from_reader(load_document(path), secrets)
    if topology is not None:
        check_devices(devices, topology, os.fspath(path))
    return devices


def devices_from_mapping(data: Mapping[str, Any], source: str = "<mapping>",
                         secrets: str | os.PathLike[str] | None = None) -> dict[str, DeviceConfig]:
    """Return the devices of an already-parsed device document.

    Examples
    --------
    >>> d = devices_from_mapping({"devices": {"core0": {"host": "127.0.0.1", "port": 3082, "ports": 16,
    ...                                                 "profile": "rotor"}}})
    >>> d["core0"].switch_delay_s
    1e-05
    """
    return _from_reader(Reader(data, source), secrets)


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
    """Return the adapter of ``cfg``'s protocol (not yet connected): Tl1Driver, NetconfDriver or GnmiDriver.

    ``overrides`` replace adapter arguments (``user``, ``password``, ``timeout_s``, ...).
    """

    kwargs = {"name": cfg.name, "user": cfg.user, "password": cfg.password, "timeout_s": cfg.timeout_s,
              "ports": cfg.ports, "switch_delay_s": cfg.switch_delay_s, **dict(cfg.options), **overrides}
    return open_adapter(cfg.protocol, cfg.host, cfg.port, **kwargs)


def open_adapter(protocol: str, host: str, port: int, **kwargs: Any) -> OcsAdapter:
    """Return the (not yet connected) adapter of ``protocol`` for the switch at ``host:port``.

    ``kwargs`` are the adapter's parameters (``name``, ``user``, ``password``, ``timeout_s``,
    ``ports``, ``switch_delay_s``, ``max_bulk`` and its protocol's own ones).
    """
    if protocol == "tl1":
        from orchestrl.fabric.ocs.driver import Tl1Driver
        return Tl1Driver(host, port, **kwargs)
    if protocol == "netconf":
        from orchestrl.fabric.ocs.netconf_driver import NetconfDriver
        return NetconfDriver(host, port, **kwargs)
    if protocol == "gnmi":
        from orchestrl.fabric.ocs.gnmi_driver import GnmiDriver
        return GnmiDriver(host, port, **kwargs)
    raise OcsRequestError(kwargs.get("name", f"{host}:{port}"), "open",
                          f"protocol {protocol!r} is unknown; use one of {', '.join(PROTOCOLS)}")
