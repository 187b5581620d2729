"""`python -m export CKPT`: export a checkpoint and prove parity (usage and exit status: export/cli.py)."""

from __future__ import annotations

import sys

from export.cli import bad_input, check_options, get_args_parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        checked = check_options(args)
    except (ValueError, OSError) as err:
        return bad_input(err)
    from export.run import run  # imports torch (~7 s of CPU): only once the options are known to be good

    return run(args, checked)


if __name__ == "__main__":
    sys.exit(main())
