"""The ``specdec`` command line: ``specdec generate | bench | train-medusa | models``."""

from specdec.cli.commands import main

__all__ = ["main"]
