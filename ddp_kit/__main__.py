"""`python -m ddp_kit`: the lessons as a student's own copy, wherever the package is installed.

python -m ddp_kit lessons DIR [--with-outputs] [--missing | --overwrite]
python -m ddp_kit reset DIR [LESSON] [--with-outputs]
"""

from __future__ import annotations

import argparse
import sys

from . import workspace


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m ddp_kit", description=__doc__.splitlines()[0])
    commands = main.add_subparsers(dest="command", required=True)
    lessons = commands.add_parser(
        "lessons", help="copy the notebooks, examples and a README into DIR",
        description="Copy the lessons into DIR (made if needed), outputs cleared. Open "
        f"DIR/{workspace.FIRST_NOTEBOOK} in Jupyter and go in order.",
    )  # fmt: skip
    lessons.add_argument("dir", metavar="DIR")
    keep = lessons.add_mutually_exclusive_group()
    keep.add_argument("--missing", action="store_true", help="copy only the lesson files DIR lacks")
    keep.add_argument(
        "--overwrite", action="store_true", help="replace the lesson files DIR has (no backup)"
    )
    reset = commands.add_parser(
        "reset", help="fresh copies of one lesson or all, the old ones kept in DIR/backups/",
        description="Fresh copies of LESSON (a notebook's path, name or number: 08) or of every "
        "lesson file; the replaced ones are moved to DIR/backups/<date_time>/.",
    )  # fmt: skip
    reset.add_argument("dir", metavar="DIR")
    reset.add_argument("lesson", metavar="LESSON", nargs="?")
    for command in (lessons, reset):
        command.add_argument(
            "--with-outputs", action="store_true", help="keep the notebooks' stored outputs"
        )
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "lessons":
            copied = workspace.copy_lessons(
                args.dir,
                with_outputs=args.with_outputs,
                overwrite=args.overwrite,
                missing_only=args.missing,
            )
            if copied:
                print(f"{len(copied)} lesson files copied into {args.dir}; start with "
                      f"{workspace.FIRST_NOTEBOOK}")  # fmt: skip
            else:
                print(f"{args.dir} has every lesson file already")
        else:
            names, backup = workspace.reset(args.dir, args.lesson, with_outputs=args.with_outputs)
            what = names[0] if len(names) == 1 else f"{len(names)} lesson files"
            kept = f"; the old copy is in {backup}" if backup else ""
            print(f"fresh {what} in {args.dir}{kept}")
    except workspace.WorkspaceError as error:
        print(f"python -m ddp_kit {args.command}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
