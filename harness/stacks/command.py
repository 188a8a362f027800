"""``python -m harness.stacks``: list, install, re-hash and locate pinned stacks (standard library only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.stacks import spec
from harness.stacks.install import install_stack, rehash_lock
from harness.stacks.spec import StackError, list_stacks, load_stack, stack_python, stack_status


def _cmd_list() -> int:
    for name in list_stacks():
        try:
            stack = load_stack(name)
        except StackError as e:
            print(f"{name:<22} BROKEN: {e}")
            continue
        print(f"{name:<22} {stack_status(stack):<14} {stack.venv.name:<26} {stack.description}")
        if stack.targets:
            print(f"{'':<22} targets: {', '.join(stack.targets)}")
        for label, why in stack.unsupported.items():
            print(f"{'':<22} not {label}: {why}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.stacks", description=spec.__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the stacks and whether each is installed")
    p_inst = sub.add_parser("install", help="install a stack into its venv (idempotent)")
    p_inst.add_argument("name")
    p_inst.add_argument(
        "--relock", action="store_true", help="resolve the pins afresh and rewrite the stack's lock"
    )
    p_inst.add_argument(
        "--venv", type=Path, help="install into this venv instead of the stack's (e.g. to try it)"
    )
    p_hash = sub.add_parser("rehash", help="re-hash the pins of a stack's lock (no resolve)")
    p_hash.add_argument("name")
    p_py = sub.add_parser("python", help="print the python of an installed stack")
    p_py.add_argument("name")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            return _cmd_list()
        if args.cmd == "python":
            py = stack_python(args.name)
            if py is None:
                stack = load_stack(args.name)
                print(
                    f"stack {args.name} is {stack_status(stack)}; run {stack.install_command()}",
                    file=sys.stderr,
                )
                return 1
            print(py)
            return 0
        if args.cmd == "rehash":
            n = rehash_lock(args.name)
            print(f"{args.name}: {n} pins hashed")
            return 0
        install_stack(args.name, relock=args.relock, venv=args.venv)
        return 0
    except StackError as e:
        print(f"harness.stacks: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

