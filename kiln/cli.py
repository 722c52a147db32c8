"""The ``kiln`` command.

    kiln info        versions of kiln, torch, bytecode and Python; CUDA; registered backends
    kiln backends    the registered backend names
    kiln cache ls | why [FUNCTION] | clear     the compile cache (kiln/cache)
    kiln cache ls --remote | clear --remote    the remote cache (KILN_REMOTE_CACHE)
    kiln package inspect FILE    a package's manifest: entries, guards, graphs, generated code
    kiln report DIR [-o report.html]    one HTML page from a structured trace (KILN_TRACE_DIR)
"""
from __future__ import annotations

import argparse
import platform
import sys

from .report import build_report
from .version import __version__


def _cache_cli():
    from .cache import cli     # (torch: only the subcommands that read the cache pay its import)
    return cli


def _list_backends() -> list:
    from .backends import list_backends     # (torch: imported by the subcommands that need it)
    return list_backends()


def _info() -> int:
    import bytecode
    import torch

    print(f"kiln      {__version__}")
    print(f"python    {platform.python_version()} ({sys.executable})")
    print(f"torch     {torch.__version__}  cuda available: {torch.cuda.is_available()}")
    print(f"bytecode  {bytecode.__version__}")
    print(f"backends  {', '.join(_list_backends())}")
    return 0


def _backends() -> int:
    print("\n".join(_list_backends()))
    return 0


def _inspect(path: str) -> int:
    from .package import PackageError     # (torch: imported by the subcommands that need it)
    from .package.manifest_text import manifest_text     # (torch, as above)
    try:
        print(manifest_text(path))
    except PackageError as e:
        print(f"kiln: {e}", file=sys.stderr)
        return 1
    return 0


def _report(path: str, output: str | None) -> int:
    try:
        written = build_report(path, output)
    except (OSError, FileNotFoundError) as e:
        print(f"kiln: {e}", file=sys.stderr)
        return 1
    print(written)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kiln", description="kiln: a compiler for PyTorch programs")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions and environment")
    sub.add_parser("backends", help="registered backends")
    cache = sub.add_parser("cache", help="the compile cache: ls, why [FUNCTION], clear")
    csub = cache.add_subparsers(dest="action", required=True)
    ls = csub.add_parser("ls", help="stored entries")
    ls.add_argument("--remote", action="store_true", help="the remote cache's (KILN_REMOTE_CACHE) instead")
    w = csub.add_parser("why", help="how a function's entries differ (why they missed)")
    w.add_argument("function", nargs="?")
    clear = csub.add_parser("clear", help="remove every entry")
    clear.add_argument("--remote", action="store_true",
                       help="remove kiln's keys from the remote cache (KILN_REMOTE_CACHE) instead")
    pkg = sub.add_parser("package", help="packages (kiln.load_package): inspect FILE")
    psub = pkg.add_subparsers(dest="action", required=True)
    ins = psub.add_parser("inspect", help="print a package's manifest (nothing in it runs)")
    ins.add_argument("file")
    rep = sub.add_parser("report", help="one HTML page from a structured trace (KILN_TRACE_DIR)")
    rep.add_argument("trace", help="the trace directory (or one trace file)")
    rep.add_argument("-o", "--output", help="the page to write (default: DIR/report.html)")
    args = p.parse_args(argv)
    if args.command == "report":
        return _report(args.trace, args.output)
    if args.command == "package":
        return _inspect(args.file)
    if args.command == "cache":
        cli = _cache_cli()
        if getattr(args, "remote", False):
            return {"ls": cli.ls_remote, "clear": cli.clear_remote}[args.action]()
        return {"ls": cli.ls, "clear": cli.clear, "why": lambda: cli.why(args.function)}[args.action]()
    return {"info": _info, "backends": _backends}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
