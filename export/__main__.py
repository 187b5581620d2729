"""`python -m export CKPT`: export a checkpoint and prove parity (usage and exit status: export/cli.py)."""

from __future__ import annotations

import sys

from export.cli import bad_input, get_args_parser
from export.options import ExportOptions


def main(argv: list[str] | None = None) -> int:
    parser = get_args_parser()
    try:
        options = ExportOptions.from_args(parser.parse_args(argv), parser)
    except (ValueError, OSError) as err:
        return bad_input(err)
    from export.run import run  # imports torch (~7 s of CPU): only once the options are known to be good

    return run(options)


if __name__ == "__main__":
    sys.exit(main())
