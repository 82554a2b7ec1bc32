"""The admin token of a server a3r started, kept where the TUI (same user) can read it and no one else.

a3r starts each ``swarm serve`` with a fresh admin token (`a3r.swarmops.processes.start_server`); the
token used to live in a3r's memory only, so ``a3r tui`` could not follow the run. It is now also written
to `TOKEN_FILE` in the server's run dir, created with mode 0600 (owner read/write only; never printed,
never logged). `read_admin_token` refuses a file that another user owns or that others may read.

The token is the server's admin token (swarm's servers have no read-only scope yet); it dies with its
server: a new server on the same run dir writes a new one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["TOKEN_FILE", "read_admin_token", "write_admin_token"]

TOKEN_FILE = "admin.token"
"""Name of the token file in a server's run dir."""


def write_admin_token(server_dir: Path, token: str) -> Path:
    """Write ``token`` to ``server_dir / TOKEN_FILE`` with mode 0600 (replacing an older token).

    Raises:
        OSError: The file cannot be written.
    """
    path = server_dir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: set it
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    return path


def read_admin_token(server_dir: str | Path | None) -> str | None:
    """The admin token a3r wrote for the server of ``server_dir``; ``None`` when there is none, or when
    the file is not this user's or is readable by others (then it is not trusted)."""
    if not server_dir:
        return None
    path = Path(server_dir) / TOKEN_FILE
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            return None
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
