"""How slurmgate's processes start (the binder, the webhook): their settings read once, from
the command line and the environment, and their logs set up at the level those name."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from slurmgate import logs
from slurmgate.config import ConfigError


class Settings(Protocol):
    @property
    def log_level(self) -> str: ...


S = TypeVar("S", bound=Settings)


def start(prog: str, load: Callable[[Sequence[str] | None, Mapping[str, str]], S],
          argv: Sequence[str] | None) -> S:
    """The process's one read of its settings (everything after gets them from what this
    returns); a bad one ends the process with its name and what is wrong, before anything ran."""
    try:
        settings = load(argv, os.environ)
    except ConfigError as e:
        raise SystemExit(f"{prog}: {e}") from None
    logs.setup(settings.log_level)
    return settings
