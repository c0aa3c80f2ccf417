"""The webhook secrets in force: the config's list plus ``webhook.secrets_file``, reloadable."""

from __future__ import annotations

import os
from pathlib import Path

from receiver.config.settings import WebhookSettings
from receiver.errors import ConfigError
from receiver.signature import HmacKey


def read_secrets_file(path: str | Path) -> tuple[str, ...]:
    """One secret a line; blank lines and lines starting with # are ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"webhook.secrets_file: {path} cannot be read ({exc})") from None
    return tuple(
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    )


def append_secret(path: str | Path, secret: str) -> None:
    """Add a secret to the file, creating it with mode 0600; older secrets stay valid."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, secret.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


class SecretBox:
    """Holds the secrets a webhook may be signed with; :meth:`reload` re-reads the file."""

    def __init__(self, settings: WebhookSettings) -> None:
        self._settings = settings
        self.secrets: tuple[str, ...] = ()
        #: The secrets as HMAC keys, prepared once (intake's hot path).
        self.keys: tuple[HmacKey, ...] = ()
        self.reload()

    def reload(self) -> int:
        """Re-read ``secrets_file``; returns how many secrets are now in force."""
        from_file = (
            read_secrets_file(self._settings.secrets_file) if self._settings.secrets_file else ()
        )
        secrets = tuple(dict.fromkeys((*self._settings.secrets, *from_file)))
        if not secrets:
            raise ConfigError(
                "webhook.secrets: no secret configured (webhook.secrets, webhook.secrets_file "
                "or RECEIVER_WEBHOOK_SECRETS)"
            )
        self.secrets, self.keys = secrets, tuple(HmacKey(s) for s in secrets)
        return len(secrets)
