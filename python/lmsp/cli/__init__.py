"""The ``lmsp`` command (:mod:`.command`), its commands on the data directory
(:mod:`.data`) and what they share (:mod:`.common`)."""

from lmsp.cli.command import main

__all__ = ["main"]
