"""SSH server pieces the emulators share (asyncssh): a password check and a fresh host key.

The NETCONF emulator serves its ``netconf`` subsystem and the TL1 emulator (``--ssh``) its command
stream over asyncssh, a maintained SSH implementation, so the clients under test (ncclient and
paramiko) negotiate real SSH: key exchange, host key, password authentication, channels.
"""

from __future__ import annotations

import hmac
from typing import Any, Callable

__all__ = ["password_server", "server_key"]


def server_key() -> Any:
    """A fresh Ed25519 host key for one emulator process (clients of an emulator do not pin it)."""
    import asyncssh

    return asyncssh.generate_private_key("ssh-ed25519")


def password_server(user: str, password: str) -> Callable[[], Any]:
    """Return an asyncssh server factory that admits exactly ``user`` with ``password``."""
    import asyncssh

    class _PasswordServer(asyncssh.SSHServer):
        def begin_auth(self, username: str) -> bool:
            return True  # always ask for a password, even for an unknown user (no user enumeration)

        def password_auth_supported(self) -> bool:
            return True

        def validate_password(self, username: str, given: str) -> bool:
            return hmac.compare_digest(username.encode(), user.encode()) and \
                hmac.compare_digest(given.encode(), password.encode())

    return _PasswordServer
