"""``orchestrl proxy ...``: run the OCS control proxy, and back up its state file.

``serve`` prints ``listening on http(s)://HOST:PORT`` once the devices are checked against the
journal and the API is up, so scripts and tests can start it on port 0 and read the address. It
refuses to start when the devices hold circuits the journal does not explain, printing the diff
(``--adopt`` or ``--reset`` decide), and when another proxy holds the state file. SIGTERM and
SIGINT stop it cleanly (sessions logged out, the state file closed and unlocked).

``backup`` copies the state file with SQLite's online backup, safe while the proxy runs; see
``docs/operations.md`` for restoring one.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
from orchestrl.agents.cli.argtypes import bounded_float, bounded_int
from orchestrl.fabric.errors import ConfigError

__all__ = ["register"]


def register(groups: argparse._SubParsersAction) -> None:
    proxy = groups.add_parser("proxy", help="run the OCS control proxy (HTTP API over the fabric controller)",
                              description="The fabric controller as a service: jobs register, announce intents and "
                                          "report collective boundaries; circuits are committed in safe windows.")
    sub = proxy.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="serve the HTTP API (OpenAPI description at /openapi.json)")
    serve.add_argument("--topology", required=True, metavar="T.yaml", help="fabric description")
    serve.add_argument("--devices", required=True, metavar="D.yaml", help="where each OCS is reached (devices.yaml)")
    serve.add_argument("--listen", default="127.0.0.1:8700", metavar="HOST:PORT",
                       help="address to serve on (default 127.0.0.1:8700; port 0 picks a free one)")
    serve.add_argument("--state", default=None, metavar="fabric.db",
                       help="SQLite state file: journal, masks, jobs (default $XDG_STATE_HOME/orchestrl/fabric.db)")
    serve.add_argument("--tokens", default=None, metavar="tokens.yaml",
                       help="file with 'operator_tokens: [...]' (default: $ORCHESTRL_OPERATOR_TOKEN, else a random "
                            "token printed at start)")
    serve.add_argument("--gate-min-observations", type=bounded_int("--gate-min-observations", 1, 10_000), default=None,
                       metavar="N", help="windows a boundary kind needs before its slack is trusted (default 5)")
    start = serve.add_mutually_exclusive_group()
    start.add_argument("--adopt", action="store_true",
                       help="take the circuits the devices hold as the committed plan (nothing on a device changes)")
    start.add_argument("--reset", action="store_true",
                       help="make the devices match the journal, removing circuits it does not explain")
    serve.add_argument("--audit-period", type=bounded_float("--audit-period", 0.05, 3600, "seconds"), default=1.0, metavar="S",
                       help="seconds between read-backs of every device (default 1)")
    serve.add_argument("--drift-policy", choices=("repair", "alert"), default="repair",
                       help="repair drift in the next safe window (default), or only report it")
    serve.add_argument("--tls-cert", default=None, metavar="cert.pem", help="serve HTTPS with this certificate")
    serve.add_argument("--tls-key", default=None, metavar="key.pem", help="private key of --tls-cert")
    serve.add_argument("--tls-ca", default=None, metavar="ca.pem",
                       help="require client certificates signed by this CA (mutual TLS)")
    serve.add_argument("--max-connections", type=bounded_int("--max-connections", 1, 65_535), default=256, metavar="N",
                       help="open connections at most; when full, a new one takes the slot of the connection waiting "
                            "longest for a request head, and gets 503 only if every slot has a request in progress "
                            "(default 256)")
    serve.add_argument("--request-timeout", type=bounded_float("--request-timeout", 0.5, 600, "seconds"), default=10.0, metavar="S",
                       help="seconds a client may take to send a request's body (default 10)")
    serve.add_argument("--header-timeout", type=bounded_float("--header-timeout", 0.1, 600, "seconds"), default=3.0,
                       metavar="S", help="seconds a connection may take to send a request's head (default 3)")
    serve.add_argument("--max-connections-per-client", type=bounded_int("--max-connections-per-client", 1, 65_535),
                       default=32, metavar="N", help="open connections per client address at most; more are answered "
                                                     "503 and closed (default 32)")
    serve.add_argument("--admin-listen", default=None, metavar="HOST:PORT",
                       help="a second listener with its own connection budget (64), for health probes and operators: "
                            "answerable however many connections clients hold on --listen")
    serve.set_defaults(func=_serve)
    backup = sub.add_parser("backup", help="copy the state file with SQLite's online backup (safe while serving)",
                            description="Write a consistent, self-contained copy of the state file, WAL included; "
                                        "`cp fabric.db` while the proxy runs misses what is still in the WAL.")
    backup.add_argument("--state", default=None, metavar="fabric.db",
                        help="the state file the proxy runs with (default $XDG_STATE_HOME/orchestrl/fabric.db)")
    backup.add_argument("out", metavar="OUT", help="the backup file to write (must not exist)")
    backup.add_argument("--json", action="store_true", help="print the summary as JSON")
    backup.set_defaults(func=_backup)


def _backup(args: argparse.Namespace) -> int:
    from orchestrl.fabric.runtime.store import backup_state_file, default_store_path

    summary = backup_state_file(args.state or str(default_store_path()), args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"backed up {summary['state']} to {summary['backup']}: {summary['committed_records']} committed "
              f"records in {summary['scopes']} scopes, {summary['bytes']} bytes, integrity {summary['integrity']}")
    return 0


def _address(option: str, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(option, "<value>", f"{value!r} is not HOST:PORT", "e.g. 127.0.0.1:8700")
    return host, int(port)


def _check_file(option: str, path: str | None) -> None:
    if path is not None and not os.path.isfile(path):
        raise ConfigError(option, "<value>", f"{path!r} is not a readable file", "a PEM file")


def _serve(args: argparse.Namespace) -> int:
    import secrets

    from orchestrl.agents.http.app import create_app
    from orchestrl.agents.http.server import HttpServer
    from orchestrl.agents.service.jobs import load_operator_tokens
    from orchestrl.agents.service.factory import open_service
    from orchestrl.fabric.runtime.store import default_store_path

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = _address("--listen", args.listen)
    admin = _address("--admin-listen", args.admin_listen) if args.admin_listen else None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert/--tls-key", "<value>", "only one of the two is given", "both, or neither")
    if args.tls_ca is not None and args.tls_cert is None:
        raise ConfigError("--tls-ca", "<value>", "client certificates need HTTPS", "also give --tls-cert and --tls-key")
    for option, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-ca", args.tls_ca)):
        _check_file(option, path)
    tokens = load_operator_tokens(args.tokens)
    if not tokens:
        tokens = [secrets.token_urlsafe(24)]
        print(f"operator token (generated; pass --tokens to fix one): {tokens[0]}", flush=True)
    state = args.state or str(default_store_path())
    service = open_service(args.topology, args.devices, state, tokens, args.gate_min_observations,
                           audit_period_s=args.audit_period, drift_policy=args.drift_policy)
    try:
        mode = "adopt" if args.adopt else "reset" if args.reset else "check"
        report = service.start(mode)
        adopted = report.get("adopted")
        print(f"reconciled {len(service.devices)} devices to the journal in {state} ({mode}): {report['changes']} "
              f"cross-connect changes, {len(report['failed_ports'])} failed ports masked, "
              f"{len(report['unreachable'])} unreachable, {'ok' if report['ok'] else 'INCOMPLETE'}"
              + (f"; adopted {adopted['circuits']} circuits" + (f" ({len(adopted['half_circuits'])} one-way "
                 "cross-connects left as drift)" if adopted['half_circuits'] else "") if adopted else ""), flush=True)
        try:
            server = HttpServer(create_app(service, body_timeout_s=args.request_timeout), host, int(port),
                                tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
                                max_connections=args.max_connections, head_timeout_s=args.header_timeout,
                                max_connections_per_client=args.max_connections_per_client, admin=admin)
        except OSError as exc:
            raise ConfigError("--listen/--admin-listen", "<value>", f"cannot listen on {args.listen}"
                              + (f" and {args.admin_listen}" if admin else "") + f": {exc.strerror}",
                              "free ports on local addresses") from None
    except BaseException:
        service.close()
        raise
    # What start-up built (topology, templates, plans, parsed configs) lives as long as the process: move it
    # out of the collector's generations, so that a full collection during a commit does not walk it
    # (bench/commit.py saw a ~24 ms gen-2 pass about once per 600 commits without this).
    gc.collect()
    gc.freeze()
    # uvicorn handles SIGTERM and SIGINT (stop accepting, finish requests), then restores the handlers it found and
    # raises the signal again: with the default SIGTERM action that would end the process before the state file is
    # closed and the switch sessions logged out, so the handler it restores does nothing.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    if server.admin_url:
        print(f"operator listener on {server.admin_url}", flush=True)
    print(f"listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    finally:
        service.close()
    return 0
