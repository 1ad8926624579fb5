"""``python -m mtpconv``: the same entry point as the ``mtpconv`` console script."""

from mtpconv.cli import main

main()
