"""The embedded server's internal logins, derived from one secret kept in the data directory.

Apart from `system` so that the command line, which prints and uses them, does not load the
actors with them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from memgate.app.settings import Settings
from memgate.bus.logins import ROLES
from memgate.bus.server import Login


def _internal_secret(settings: Settings) -> str:
    if settings.nats_password is not None:
        return settings.nats_password.get_secret_value()
    path = settings.data_dir / "nats" / "internal.secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


def internal_logins(settings: Settings) -> dict[str, Login]:
    """The embedded server's internal users: `<nats_user>-<kind>`, each password derived from
    the one kept secret, each with only its kind's permissions (`bus.logins.ROLES`)."""
    secret = _internal_secret(settings).encode()

    def password(kind: str) -> str:
        digest = hmac.new(secret, kind.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    return {kind: Login(f"{settings.nats_user}-{kind}", password(kind),
                        role.permissions(kind))
            for kind, role in ROLES.items()}
