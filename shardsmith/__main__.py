"""The package's commands, one entry: `python -m shardsmith COMMAND ...` (or `shardsmith COMMAND ...`).

Rules run scripts/; these are what a person runs. Each command is named here once, with the function that
adds its arguments (and sets `run`); only the command given is imported, so `summary` starts without
importing what `new-config` reads, and modules can move without renaming a command.
"""

import argparse
import importlib
import sys

# name: ("module:function that adds the command's arguments", help)
COMMANDS = {
    "new-config": (
        "shardsmith.cli.newconfig.command:add_arguments",
        "write a complete, commented config for your inputs (to stdout)",
    ),
    "retry-failed": (
        "shardsmith.download.part:add_retry_arguments",
        "mark downloaded parts with retryable failures to be fetched again by the next run",
    ),
    "publish": (
        "shardsmith.publish.dataset:add_publish_arguments",
        "publish files as {dest}/{dataset}/{version}/ and move latest",
    ),
    "versions": (
        "shardsmith.publish.dataset:add_versions_arguments",
        "print a destination's complete versions and what latest names",
    ),
    "refresh": (
        "shardsmith.cli.refresh:add_arguments",
        "refresh a dataset: only new or changed parts run; a new version is published",
    ),
    "summary": ("shardsmith.report.summary:add_arguments", "print the one-screen summary of a built dataset"),
    "demo": ("shardsmith.cli.demo:add_arguments", "generate the demo's input data"),
    "tiny-clip": (
        "shardsmith.cli.tinyclip:add_arguments",
        "write the tiny random open_clip model tests and the demo use",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="shardsmith", description=__doc__.split("\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (target, help_) in COMMANDS.items():
        sub = commands.add_parser(
            name,
            help=help_,
            description=help_,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        if argv and argv[0] == name:  # only the command given is imported
            module, _, function = target.partition(":")
            getattr(importlib.import_module(module), function)(sub)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "pass_through", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
