"""The package's commands: `python -m shardsmith COMMAND ...`.

Modules with a command of their own keep it (`python -m shardsmith.download retry-failed`, ...).
"""

import argparse
import sys

from shardsmith import newconfig

COMMANDS = {"new-config": newconfig}  # name: module with HELP, add_arguments(parser) (which sets `run`)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardsmith", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        sub = commands.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        module.add_arguments(sub)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
