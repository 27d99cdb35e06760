"""`python -m trainer ...`: `make-tiny-model DIR` here; everything else goes to trainer.cli (the GRPO run)."""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "make-tiny-model":
        from trainer.tiny_model import main as make_tiny_model_main

        return make_tiny_model_main(argv[1:])
    try:
        cli = importlib.import_module("trainer.cli")
    except ModuleNotFoundError as exc:
        if exc.name != "trainer.cli":
            raise
        print("usage: python -m trainer make-tiny-model DIR", file=sys.stderr)
        return 2
    return cli.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
