"""`infinity-server serve | models | download | gate`."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from model_registry.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infinity-server", description="A model server for retrieval.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the configured models (the bundled MiniLM without a config)")
    serve.add_argument("--config", help="YAML file with 'models' and 'server' (env INFINITY_SERVER_CONFIG)")
    serve.add_argument("--host", help="address to bind (default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="port to bind (default 7997)")
    serve.add_argument("--api-key", dest="api_key", help="require 'Authorization: Bearer KEY'")
    serve.add_argument("--max-body-bytes", dest="max_body_bytes", type=int, help="largest accepted request body")
    serve.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    models = commands.add_parser("models", help="list the configured models, where they come from, their record")
    models.add_argument("--config", help="YAML file with 'models' and 'server'")
    models.add_argument("--catalogue", action="store_true", help="list the catalogue of known published models")
    download = commands.add_parser(
        "download", help="fetch every configured hub model into the Hugging Face cache, check the others, exit"
    )
    download.add_argument("--config", help="YAML file with 'models' and 'server' (env INFINITY_SERVER_CONFIG)")
    gate = commands.add_parser(
        "gate", help="the front of model groups that scale to zero: holds their requests while a replica starts"
    )
    gate.add_argument("--config", required=True, help="YAML file with a 'gate' section (docs/deploy.md)")
    gate.add_argument("--host", help="address to bind (default: the file's, else 0.0.0.0)")
    gate.add_argument("--port", type=int, help="port to bind (default: the file's, else 7997)")
    return parser


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    names = ("host", "port", "api_key", "max_body_bytes", "log_level")
    return {name: getattr(args, name) for name in names}


async def _serve(args: argparse.Namespace) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from infinity_server.app import create_app
    from infinity_server.logs import configure_logging
    from infinity_server.settings import load_settings
    from infinity_server.shutdown import drain_on
    from infinity_server.tracing import setup_provider

    settings = load_settings(args.config, flags=_flags(args))
    configure_logging(settings.server.log_level, settings.server.log_format)
    if settings.server.tracing:
        setup_provider()
    config = Config()
    config.bind = [f"{settings.server.host}:{settings.server.port}"]
    # The drain (infinity_server.shutdown) already waited for requests in flight; what is left
    # after it is cut short.
    config.graceful_timeout = 1.0
    config.accesslog = None
    # Hypercorn's default of 100 drops a burst's extra SYNs: their clients then wait 1-3 s in TCP
    # retransmits before the server, and its deadlines, even see them.
    config.backlog = 2048
    config.errorlog = logging.getLogger("hypercorn.error")
    app = create_app(settings)
    signalled, stop = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (stop if signalled.is_set() else signalled).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    trigger = functools.partial(drain_on, signalled, app.state.drain, settings.server.graceful_timeout, stop)
    await serve(app, config, shutdown_trigger=trigger)  # type: ignore[arg-type]


async def _gate(args: argparse.Namespace) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from infinity_server.gate import create_gate_app, load_gate_settings
    from infinity_server.logs import configure_logging

    settings = load_gate_settings(args.config)
    configure_logging("info", "json")
    config = Config()
    config.bind = [f"{args.host or settings.host}:{args.port or settings.port}"]
    config.graceful_timeout = 5.0
    config.accesslog = None
    config.backlog = 2048
    config.errorlog = logging.getLogger("hypercorn.error")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve(create_gate_app(settings), config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


def _models(args: argparse.Namespace) -> None:
    """One line per configured model (`catalogue=` the record its source matched), or per record."""
    from infinity_server.settings import load_settings
    from model_registry import catalogue_listing
    from model_registry import catalogue_match as match
    from model_registry.types import Kind

    if args.catalogue:
        for known in catalogue_listing():
            facts = {k: v for k, v in known.items() if k not in ("id", "kind", "keys", "note")}
            shown = "\t".join(f"{key}={value}" for key, value in facts.items())
            print(f"{known['id']}\tkind={known['kind']}" + (f"\t{shown}" if shown else ""))
        return
    settings = load_settings(args.config)
    for spec in settings.registry.models:
        kind = spec.kind.value if isinstance(spec.kind, Kind) else spec.kind
        record = match(spec.source)
        print(f"{spec.name}\t{spec.source}\tkind={kind}\tpin={spec.pin}\tcatalogue={record.id if record else '-'}")


def _download(args: argparse.Namespace) -> int:
    """0 when every model is available locally afterwards, 1 when any is not (each one is reported)."""
    from infinity_server.download import Outcome, describe, download_all
    from infinity_server.settings import load_settings

    settings = load_settings(args.config)
    results = download_all(settings.registry.models, report=lambda result: print(describe(result), flush=True))
    failed = [result.name for result in results if result.outcome is Outcome.FAILED]
    if failed:
        print(f"infinity-server: {len(failed)} model(s) could not be fetched: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _run(coroutine: Any) -> None:
    try:
        import uvloop

        uvloop.run(coroutine)
    except ImportError:
        asyncio.run(coroutine)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            _run(_serve(args))
        elif args.command == "gate":
            _run(_gate(args))
        elif args.command == "download":
            return _download(args)
        else:
            _models(args)
    except ConfigError as error:
        print(f"infinity-server: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
