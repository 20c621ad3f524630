"""``orchestrl ocs ...``: run an emulated optical circuit switch, and drive a switch by hand.

``emulate`` serves an emulated switch in Polatis TL1 (TCP or SSH), NETCONF (Polatis optical-switch
YANG) or gNMI (SONiC OCS), with faults settable from the command line and at run time
(:mod:`fabric.ocs.device_core`); ``list``, ``connect``, ``disconnect`` and ``status`` talk to any
such switch through the adapter of its protocol (:mod:`fabric.ocs.adapter`), from ``--devices`` or
from ``--device HOST:PORT --protocol ... --user ... --password ...``.
"""

from __future__ import annotations

import argparse
import json

from orchestrl.agents.cli.argtypes import bounded_float, bounded_int
from orchestrl.fabric.errors import ConfigError

__all__ = ["register"]


def register(groups: argparse._SubParsersAction) -> None:
    ocs = groups.add_parser("ocs", help="optical circuit switches: emulate one, list/connect/disconnect/status",
                            description="OCS device layer: emulators and clients for TL1, NETCONF and gNMI "
                                        "switches (docs/ocs.md).")
    sub = ocs.add_subparsers(dest="command", metavar="COMMAND", required=True)

    emu = sub.add_parser("emulate", help="serve an emulated switch over TL1/TCP until interrupted",
                         description="Prints 'listening on HOST:PORT' once ready (use --listen 127.0.0.1:0 for a "
                                     "free port). Faults can also be changed at run time (docs/ocs.md).")
    emu.add_argument("--protocol", default="tl1", choices=("tl1", "netconf", "gnmi"),
                     help="tl1 (Polatis TL1 over TCP, or SSH with --ssh), netconf (Polatis optical-switch YANG over "
                          "SSH) or gnmi (SONiC OCS tables over gRPC); default tl1")
    emu.add_argument("--ssh", action="store_true", help="TL1 over SSH instead of plain TCP (--protocol tl1)")
    emu.add_argument("--listen", default="127.0.0.1:3082", metavar="HOST:PORT", help="address (default 127.0.0.1:3082)")
    emu.add_argument("--ports", type=bounded_int("--ports", 1, 4096), default=None, metavar="N",
                     help="ports per side (ingress 1..N, egress N+1..2N); default: the profile's radix")
    emu.add_argument("--profile", default="mems-3d", metavar="NAME",
                     help="switching technology (OrchestrRL Table 2): rotor, mems-3d, piezo, liquid-crystal, "
                          "robotic, or test (no delay); default mems-3d")
    emu.add_argument("--switch-delay-ms", type=bounded_float("--switch-delay-ms", 0, 3.6e6, "ms"), default=None, metavar="MS", help="override the profile's delay")
    emu.add_argument("--user", default="admin", help="login user: TL1 ACT-USER, SSH for NETCONF, gNMI metadata (default admin)")
    emu.add_argument("--password", default="admin", help="login password (default admin)")
    emu.add_argument("--sid", default="OCS-EMU", help="TL1 source identifier in response headers")
    emu.add_argument("--fail-ports", default="", metavar="P,P", help="ports failed from the start, e.g. 3,7")
    emu.add_argument("--drop-replies", type=bounded_float("--drop-replies", 0, 1, "(a probability)"), default=0.0, metavar="P",
                     help="probability that a reply is never sent (the command still runs)")
    emu.add_argument("--delay-replies-ms", type=bounded_float("--delay-replies-ms", 0, 3.6e6, "ms"), default=0.0, metavar="MS", help="extra delay before each reply")
    emu.add_argument("--partial-bulk", type=bounded_int("--partial-bulk", 0, 1 << 20), default=None, metavar="K",
                     help="apply only the first K pairs of larger ENT-PATCH bulks, then DENY SABT")
    emu.add_argument("--seed", type=int, default=None, help="seed of the random reply dropping")
    emu.add_argument("--control-port", type=bounded_int("--control-port", 0, 65535), default=None, metavar="PORT",
                     help="serve the fault-injection verbs on a listener of their own (0: a free port), which stays "
                          "up while the switch is restarted or held down; NETCONF, gNMI and TL1/SSH always have one")
    emu.set_defaults(func=_emulate)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--device", required=True, metavar="HOST:PORT|NAME",
                        help="switch address, or a device name of --devices")
    client.add_argument("--devices", metavar="devices.yaml", help="device file naming host, port, protocol")
    client.add_argument("--secrets", metavar="secrets.yaml", help="secrets file of the device file's credentials "
                                                                  "(default: the one the device file names)")
    client.add_argument("--protocol", default=None, choices=("tl1", "netconf", "gnmi"),
                        help="what the switch speaks (default: from --devices, else tl1)")
    client.add_argument("--transport", default=None, choices=("tcp", "ssh"), help="TL1 over tcp (default) or ssh")
    client.add_argument("--user", default=None, help="login user (default: from --devices, else admin)")
    client.add_argument("--password", default=None, help="login password (default: from --devices' secrets, else "
                                                         "admin); prefer --devices with a secrets file on shared hosts")
    client.add_argument("--timeout", type=bounded_float("--timeout", 0.001, 3600, "seconds"), default=None, metavar="S", help="reply timeout (default 5 s)")
    client.add_argument("--json", action="store_true", help="print JSON")

    lst = sub.add_parser("list", parents=[client], help="print the cross-connect table")
    lst.add_argument("--duplex", action="store_true", help="print full-duplex circuits and half circuits instead")
    lst.set_defaults(func=_list)
    con = sub.add_parser("connect", parents=[client], help="create cross-connects in one bulk",
                         description="Pairs are INGRESS,EGRESS device ports (e.g. 1,17 2,18); with --duplex they "
                                     "are duplex ports A,B and each becomes the two cross-connects of a circuit.")
    con.add_argument("pairs", nargs="+", metavar="A,B")
    con.add_argument("--duplex", action="store_true", help="pairs are duplex ports 1..N (full-duplex circuits)")
    con.add_argument("--mode", default="stop", choices=("stop", "continue"), help="bulk mode (default stop)")
    con.set_defaults(func=_connect)
    dis = sub.add_parser("disconnect", parents=[client], help="remove the cross-connects on ports")
    dis.add_argument("ports", nargs="+", type=int, metavar="PORT")
    dis.set_defaults(func=_disconnect)
    st = sub.add_parser("status", parents=[client], help="print port states and alarms")
    st.add_argument("--all", action="store_true", help="also list ports in state normal")
    st.set_defaults(func=_status)


def _host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(flag, flag.lstrip("-"), f"{text!r} is not HOST:PORT", "e.g. 127.0.0.1:3082")
    return host, int(port)


def _emulate(args: argparse.Namespace) -> int:
    from orchestrl.fabric.ocs.emulator import PROFILES, EmulatorConfig, profile_delay_s, run_emulator
    from orchestrl.fabric.ocs.tl1 import parse_ports

    host, port = _host_port(args.listen, "--listen")
    if args.ssh and args.protocol != "tl1":
        raise ConfigError("--ssh", "ssh", f"applies to --protocol tl1 only (--protocol {args.protocol} has its own "
                                          "transport)", "drop --ssh")
    profile_delay_s(args.profile)
    config = EmulatorConfig(
        ports=args.ports or PROFILES[args.profile][1], profile=args.profile, host=host, port=port, user=args.user,
        password=args.password, sid=args.sid,
        switch_delay_s=None if args.switch_delay_ms is None else args.switch_delay_ms / 1e3,
        fail_ports=parse_ports(args.fail_ports.replace(",", "&"), args.sid, "--fail-ports"),
        drop_probability=args.drop_replies, delay_replies_s=args.delay_replies_ms / 1e3,
        partial_bulk=args.partial_bulk, seed=args.seed,
    )
    try:
        run_emulator(config, announce=lambda line: print(line, flush=True), protocol=args.protocol, ssh=args.ssh,
                     control_port=args.control_port)
    except OSError as exc:  # binding the listener: address in use, not local, no permission
        raise ConfigError("--listen", "<value>", f"cannot listen on {args.listen}: {exc.strerror or exc}",
                          "a free port on a local address (port 0 picks one)") from None
    return 0


def _driver(args: argparse.Namespace):
    """The adapter of the switch ``--device`` names: from the device file, or an address with --protocol."""
    from orchestrl.fabric.ocs.devices import open_adapter
    from orchestrl.fabric.ocs.devices import load_devices, open_device

    overrides = {k: v for k, v in (("user", args.user), ("password", args.password), ("timeout_s", args.timeout))
                 if v is not None}
    if args.devices:
        devices = load_devices(args.devices, secrets=args.secrets)
        if args.device not in devices:
            raise ConfigError(args.devices, "devices", f"no device named {args.device!r}", ", ".join(sorted(devices)))
        cfg = devices[args.device]
        if args.protocol and args.protocol != cfg.protocol:
            raise ConfigError(args.devices, f"devices.{args.device}.protocol", f"is {cfg.protocol!r} but --protocol "
                                                                             f"{args.protocol} was given",
                              "drop --protocol, or change the device file")
        return open_device(cfg, **overrides)
    host, port = _host_port(args.device, "--device")
    protocol = args.protocol or "tl1"
    if args.transport and protocol != "tl1":
        raise ConfigError("--transport", "transport", f"applies to --protocol tl1 only, not {protocol}", "drop --transport")
    extra = {"transport": args.transport} if args.transport else {}
    return open_adapter(protocol, host, port, **{"user": "admin", "password": "admin", **extra, **overrides})


def _print(args: argparse.Namespace, doc: object, text: str) -> None:
    print(json.dumps(doc, indent=2) if args.json else text)


def _list(args: argparse.Namespace) -> int:
    from orchestrl.fabric.ocs.model import cross_connects_to_duplex

    with _driver(args) as drv:
        table = drv.open().cross_connects()
        if args.duplex:
            view = cross_connects_to_duplex(table, drv.ports)
            doc = {"circuits": view.circuits, "half_circuits": view.half_circuits}
            text = "\n".join([f"{a} <-> {b}" for a, b in view.circuits]
                             + [f"{i} -> {e}  (half circuit: reverse missing)" for i, e in view.half_circuits])
        else:
            doc = {str(i): e for i, e in table.items()}
            text = "\n".join(f"{i} -> {e}" for i, e in table.items())
    _print(args, doc, text or "(no cross-connects)")
    return 0


def _parse_pair(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(",")
    if not sep or not a.strip().isdigit() or not b.strip().isdigit():
        raise ConfigError("connect", "pairs", f"{text!r} is not two port numbers A,B", "e.g. 1,17")
    return int(a), int(b)


def _connect(args: argparse.Namespace) -> int:
    from orchestrl.fabric.ocs.model import duplex_to_cross_connects

    pairs = [_parse_pair(p) for p in args.pairs]
    with _driver(args) as drv:
        if args.duplex:
            pairs = [xc for a, b in pairs for xc in duplex_to_cross_connects(a, b, drv.open().ports)]
        result = drv.connect(pairs, mode=args.mode)
    doc = [{"ingress": s.ingress, "egress": s.egress, "status": s.status, "message": s.message}
           for s in result.statuses]
    _print(args, doc, "\n".join(f"{s.ingress} -> {s.egress}  {s.status}" + (f"  {s.message}" if s.message else "")
                                for s in result.statuses))
    return 0 if result.ok else 1


def _disconnect(args: argparse.Namespace) -> int:
    with _driver(args) as drv:
        result = drv.disconnect(args.ports)
    doc = [{"ingress": s.ingress, "egress": s.egress, "status": s.status} for s in result.statuses]
    _print(args, doc, "\n".join(f"removed {s.ingress} -> {s.egress}" for s in result.statuses) or "(nothing to remove)")
    return 0


def _status(args: argparse.Namespace) -> int:
    with _driver(args) as drv:
        status = drv.port_status()
    shown = [s for s in status.values() if args.all or s.state.value != "normal"]
    doc = {str(s.port): {"state": s.state.value, "alarm": s.alarm} for s in shown}
    text = "\n".join(f"{s.port:>5}  {s.state.value}" + (f"  {s.alarm}" if s.alarm else "") for s in shown)
    _print(args, doc, text or f"all {len(status)} ports normal")
    return 0
