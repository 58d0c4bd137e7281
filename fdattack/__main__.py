"""``python -m fdattack`` is the same as the ``fdattack`` console script."""

from fdattack.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
