"""`gguf-lens serve`: an OpenAI-compatible endpoint on one model (engine.serve), loopback only unless told otherwise."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable

from engine.cli.options import add_numerics
from engine.errors import LensError, SettingError

KEY_ENV = "GGUF_LENS_API_KEY"  # the key without putting it on the command line (where `ps` shows it)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.catalog import CATALOG, resolve_model  # noqa: PLC0415
    from engine.serve.runner import Runner, model_id_for  # noqa: PLC0415
    from engine.serve.server import Server, is_loopback  # noqa: PLC0415

    key = args.api_key if args.api_key is not None else os.environ.get(KEY_ENV)
    if key is not None and not key.strip():
        raise SettingError("--api-key: the key is empty")
    if not 1 <= args.max_queue <= 100_000:
        raise SettingError(f"--max-queue {args.max_queue}: must be between 1 and 100000")
    if not 1024 <= args.max_body <= 1 << 30:
        raise SettingError(f"--max-body {args.max_body}: must be between 1024 and 1073741824 bytes")
    if args.model not in CATALOG:  # a path: refused now if it is not a file (a catalog model is fetched while serving)
        resolve_model(args.model)
    logging.getLogger("engine.serve").setLevel(logging.INFO)  # a line per request: queued, done
    failed: list[BaseException] = []
    servers: list[Server] = []

    def on_failed(exc: BaseException) -> None:
        failed.append(exc)
        if servers:
            servers[0].fail()

    runner = Runner(lambda: _load(args), model_id=model_id_for(args.model), max_queue=args.max_queue,
                    on_failed=on_failed)
    server = Server(runner, host=args.host, port=args.port, api_key=key, max_body=args.max_body)
    servers.append(server)
    if not is_loopback(args.host):
        print(f"warning: listening on {args.host}: anyone who can reach this machine on port {server.port} can use "
              f"the model{'' if key else ' (no --api-key set)'}", file=sys.stderr)
    print(f"serving {runner.model_id} at {server.url} (the model loads now: 503 until it is ready); Ctrl+C stops",
          file=sys.stderr)
    server.run()
    if failed:
        exc = failed[0]
        if isinstance(exc, LensError):
            raise exc
        raise RuntimeError(f"loading the model failed: {type(exc).__name__}: {exc}") from exc
    return 0


def _load(args: argparse.Namespace) -> Any:
    """The model as `gguf-lens generate` loads it (warm, NumPy backend, the same numerics), so that greedy replies
    are its own; a first start's note on kernels still compiling in the background goes to stderr."""
    from engine.kernels import precompile  # noqa: PLC0415
    from engine.model import load_model  # noqa: PLC0415

    model = load_model(args.model, numerics=args.numerics, flash_attn=args.flash_attn)
    running = precompile.late_status()
    if running is not None:
        print(f"note: first start: faster kernels are compiling in the background ({running:.0f} s so far); "
              f"until they are ready tokens take a slower path with the same numbers", file=sys.stderr)
    return model


def add_command(sub: Any, add_model: Callable[..., None]) -> None:
    """Register the `serve` sub-command."""
    p = sub.add_parser("serve", help="an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions)",
                       description="Serve one model with OpenAI's API on http://HOST:PORT/v1. Requests run one at a "
                                   "time in the order they came; each is logged with the queue length.")
    add_model(p, optional=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (or set ${KEY_ENV})")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting or running at once; more are answered 429 (default 64)")
    p.add_argument("--max-body", type=int, default=1 << 20, help="largest request body in bytes (default 1 MiB)")
    add_numerics(p)
    p.set_defaults(func=cmd_serve)
