"""The ``mtpconv`` command line (the only package that imports typer).

``app`` (app.py) is the Typer app; ``main`` (entry.py) is the console-script entry point that maps every
failure to one ``Error: ...`` line. ``options`` holds the shared option types and
choice Enums, ``render`` every table and JSON document.
"""

from mtpconv.cli.app import app
from mtpconv.cli.entry import main

__all__ = ["app", "main"]
