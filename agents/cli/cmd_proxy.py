"""``orchestrl proxy ...``: run the OCS control proxy (:mod:`agents.http.proxy`) from the command line.

``serve`` prints ``listening on http://HOST:PORT`` once the devices are reconciled to the journal
and the API is up, so scripts and tests can start it on port 0 and read the address. SIGTERM and
SIGINT stop it cleanly (sessions logged out, the state file closed).
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import threading
from typing import Any

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
    serve.add_argument("--gate-min-observations", type=int, default=None, metavar="N",
                       help="windows a boundary kind needs before its slack is trusted (default 5)")
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import secrets

    from agents.service.jobs import load_operator_tokens
    from agents.http.proxy import make_server, open_service
    from fabric.errors import ConfigError
    from fabric.runtime.store import default_store_path

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError("--listen", "<value>", f"{args.listen!r} is not HOST:PORT", "e.g. 127.0.0.1:8700")
    if args.gate_min_observations is not None and args.gate_min_observations < 1:
        raise ConfigError("--gate-min-observations", "<value>", f"{args.gate_min_observations} is below 1",
                          "an integer >= 1")
    tokens = load_operator_tokens(args.tokens)
    if not tokens:
        tokens = [secrets.token_urlsafe(24)]
        print(f"operator token (generated; pass --tokens to fix one): {tokens[0]}", flush=True)
    state = args.state or str(default_store_path())
    service = open_service(args.topology, args.devices, state, tokens, args.gate_min_observations)
    try:
        report = service.recover()
        print(f"reconciled {len(service.devices)} devices to the journal in {state}: {report['changes']} "
              f"cross-connect changes, {len(report['failed_ports'])} failed ports masked, "
              f"{'ok' if report['ok'] else 'INCOMPLETE'}", flush=True)
        try:
            server = make_server(service, host, int(port))
        except OSError as exc:
            raise ConfigError("--listen", "<value>", f"cannot listen on {args.listen}: {exc.strerror}",
                              "a free port on a local address") from None
    except BaseException:
        service.close()
        raise

    def shutdown(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    # What start-up built (topology, templates, plans, parsed configs) lives as long as the process: move it
    # out of the collector's generations, so that a full collection during a commit does not walk it
    # (bench/commit.py saw a ~24 ms gen-2 pass about once per 600 commits without this).
    gc.collect()
    gc.freeze()
    print(f"listening on {server.url}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        service.close()
    return 0
