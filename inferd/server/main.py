"""`inferd serve`: settings -> app -> listen; SIGTERM drains (fail /health, stop accepting, let requests finish,
exit 0)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from typing import TYPE_CHECKING

from inferd.config import ConfigError, Settings, add_arguments, describe, load_settings, read_api_keys
from inferd.server.early_load import EarlyStart, start_early_load
from inferd.server.systemd import Notifier

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("inferd.server")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferd serve",
        description="Serve a model over an OpenAI-compatible HTTP API. Every option can "
        "also be set in the TOML file (--config) or as INFERD_<NAME>; options win over both.",
    )
    parser.add_argument("model_arg", nargs="?", metavar="MODEL", help="same as --model")
    add_arguments(parser)
    return parser


def serve_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.model_arg and not args.model:
        args.model = args.model_arg
    try:
        settings = load_settings(args)
        api_keys = read_api_keys(settings)
    except ConfigError as e:
        print(f"inferd serve: error: {e}", file=sys.stderr)
        return 2
    if settings.device != "cpu":
        from inferd.engine.device import DeviceError, check_device

        try:
            check_device(settings.device)
        except DeviceError as e:
            print(f"inferd serve: error: {e}", file=sys.stderr)
            return 1
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.debug("settings: %s", describe(settings))
    if settings.host not in ("127.0.0.1", "::1", "localhost") and not api_keys:
        log.warning("listening on %s without API keys: anyone who can reach this port can use the model", settings.host)
    early = start_early_load(settings)  # beside the imports the server's start begins with (app, aiohttp, APIs)
    if early is not None:
        early.wait_repacking()
        early.build_tokenizer()
    try:
        return asyncio.run(serve(settings, api_keys, early=early))
    except KeyboardInterrupt:
        return 0


async def serve(
    settings: Settings,
    api_keys: list[str],
    notifier: Notifier | None = None,
    early: EarlyStart | None = None,
) -> int:
    """`early`: the model's load already under way (start_early_load); otherwise the app loads it once listening."""
    from aiohttp import web

    from inferd.server.app import create_app
    from inferd.server.state import STATE

    notifier = notifier or Notifier()
    app = create_app(settings, api_keys=api_keys, notifier=notifier, early=early)
    state = app[STATE]
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=max(settings.drain_timeout_s, 0.1)
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, e.strerror or e)
        await runner.cleanup()
        return 1
    log.info("listening on http://%s:%d", settings.host, site.port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failed = asyncio.ensure_future(_wait_failed(state))
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([failed, stopper], return_when=asyncio.FIRST_COMPLETED)
    failed.cancel()
    stopper.cancel()
    if state.status == "failed":
        await runner.cleanup()
        print(f"inferd serve: error: {state.failure}", file=sys.stderr)
        return 1
    await drain(state, site, settings.drain_timeout_s, settings.drain_delay_s)
    await runner.cleanup()
    notifier.close()
    return 0


async def _wait_failed(state) -> None:
    await state.ready_event.wait()
    if state.status != "failed":
        await asyncio.Event().wait()  # ready: only a signal ends the server now


async def drain(state, site: web.TCPSite, grace_s: float, delay_s: float = 0.0) -> None:
    """The order a load balancer needs: /health fails first while requests are still served for `delay_s`
    (the balancer's checks take the replica out meanwhile), then stop listening and refuse new requests on
    open connections, give running ones `grace_s` to finish, and return (the caller exits)."""
    state.status = "draining"
    n = state.in_flight
    log.info("draining: %d requests in flight, up to %.0f s", n, delay_s + grace_s)
    state.notifier.stopping(f"draining {n} requests")
    if delay_s > 0:
        await asyncio.sleep(delay_s)
    state.accepting = False
    await site.stop()
    try:
        await asyncio.wait_for(state.idle.wait(), grace_s)
        return
    except TimeoutError:
        log.warning("drain timed out with %d requests still running; ending them", state.in_flight)
    if state.engine_loop is not None:
        # Stopping the scheduler ends every request with "the server is shutting down": streams get an
        # error event and [DONE] instead of a cut connection.
        await asyncio.get_running_loop().run_in_executor(None, state.engine_loop.stop)
        try:
            await asyncio.wait_for(state.idle.wait(), 2.0)
        except TimeoutError:
            pass
