"""The secrets file: the switches' user names and passwords, kept out of the device file.

::

    # secrets.yaml, mode 0600 (readable by the proxy's user only)
    credentials:
      default:   {user: admin, password: "s3cret"}     # for every switch without its own entry
      core0:     {user: ops,   password: "0ther"}      # a device file entry names it (credentials: core0)

A device file entry takes ``credentials: <name>`` (default: its own device name when the secrets
file has such an entry, else ``default``). A file others can read is refused, and so is a missing
entry, each with the file, the field and the fix (:class:`fabric.errors.ConfigError`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError

__all__ = ["Credentials", "Secrets", "load_secrets"]


@dataclass(frozen=True)
class Credentials:
    """One login: user and password (the password is never printed)."""

    user: str
    password: str

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r})"


@dataclass(frozen=True)
class Secrets:
    """The entries of a secrets file, by name."""

    path: str
    entries: dict[str, Credentials]

    def lookup(self, name: str | None, device: str, source: str) -> Credentials:
        """The credentials ``name`` names (None: the device's own entry, else ``default``)."""
        key = name if name is not None else (device if device in self.entries else "default")
        if key not in self.entries:
            raise ConfigError(source, f"devices.{device}.credentials", f"names {key!r}, which {self.path} does not hold",
                              f"add credentials.{key} to {self.path}, or one of {', '.join(sorted(self.entries)) or '(none)'}")
        return self.entries[key]


def load_secrets(path: str | os.PathLike[str]) -> Secrets:
    """Read a secrets file; refuse one that the group or others may read.

    Raises
    ------
    ConfigError
        If the file is missing, readable by others, or an entry lacks ``user`` or ``password``.
    """
    path = os.fspath(path)
    try:
        mode = Path(path).stat().st_mode
    except OSError as exc:
        raise ConfigError(path, "secrets", f"cannot be read ({exc.strerror})", "a YAML file of credentials") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(path, "secrets", f"is readable by others (mode {stat.S_IMODE(mode):o})",
                          f"chmod 600 {path}")
    r: Reader = load_document(path)
    r.reject_unknown({"credentials"})
    creds = r.section("credentials")
    entries = {}
    for name in creds.data:
        entry = creds.section(str(name))
        entry.reject_unknown({"user", "password"})
        entries[str(name)] = Credentials(entry.str("user"), entry.str("password"))
    return Secrets(path, entries)
