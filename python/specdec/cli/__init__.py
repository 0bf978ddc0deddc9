"""The ``specdec`` command line: ``specdec generate | bench | train-medusa | train-eagle | models``."""

from specdec.cli.commands import main

__all__ = ["main"]
