"""Token and TLS settings, shared by the worker, run, inspect and health commands."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .settings import ConfigError, Setting

__all__ = ["TLS_SETTINGS", "TlsFiles", "resolve_tls", "resolve_token"]


TLS_SETTINGS: tuple[Setting, ...] = (
    Setting("token", "--token", "GRADWIRE_TOKEN", "cluster token (prefer --token-file)"),
    Setting(
        "token_file",
        "--token-file",
        "GRADWIRE_TOKEN_FILE",
        "file holding the cluster token (e.g. a mounted Secret)",
        metavar="PATH",
    ),
    Setting("tls_cert", "--tls-cert", "GRADWIRE_TLS_CERT", "PEM certificate file", metavar="PATH"),
    Setting("tls_key", "--tls-key", "GRADWIRE_TLS_KEY", "PEM private key file", metavar="PATH"),
    Setting("tls_ca", "--tls-ca", "GRADWIRE_TLS_CA", "PEM CA file of the peers", metavar="PATH"),
    Setting(
        "tls_require_client_auth",
        "--tls-require-client-auth",
        "GRADWIRE_TLS_REQUIRE_CLIENT_AUTH",
        "mutual TLS: require a client certificate",
        kind="bool",
        default=False,
    ),
    Setting(
        "tls_server_name",
        "--tls-server-name",
        "GRADWIRE_TLS_SERVER_NAME",
        "name to verify in the peers' certificates, when it differs from the host",
    ),
)


@dataclass(frozen=True)
class TlsFiles:
    """Checked TLS file paths (None: not configured)."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    require_client_auth: bool = False
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether any TLS material is configured."""
        return self.cert is not None or self.ca is not None


def _readable(path: str, source: str) -> str:
    if not os.path.isfile(path):
        raise ConfigError(f"{source}: no such file: {path}")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{source}: file not readable: {path}")
    return path


def resolve_tls(values: dict[str, tuple[Any, str]]) -> TlsFiles:
    """Check the TLS settings of resolved ``values``.

    Raises:
        ConfigError: a file is missing or unreadable, a certificate without its key (or the
            reverse), or client authentication without a CA.
    """
    (cert, cert_src), (key, key_src), (ca, ca_src) = (
        values["tls_cert"],
        values["tls_key"],
        values["tls_ca"],
    )
    if (cert is None) != (key is None):
        given, missing = ((cert_src, "--tls-key"), (key_src, "--tls-cert"))[cert is None]
        raise ConfigError(f"{given} needs {missing} too (a certificate and its key go together)")
    require, _ = values["tls_require_client_auth"]
    if require and ca is None:
        raise ConfigError("--tls-require-client-auth needs --tls-ca (the CA of the clients)")
    return TlsFiles(
        cert=_readable(cert, cert_src) if cert else None,
        key=_readable(key, key_src) if key else None,
        ca=_readable(ca, ca_src) if ca else None,
        require_client_auth=bool(require),
        server_name=values["tls_server_name"][0],
    )


def resolve_token(values: dict[str, tuple[Any, str]]) -> str | None:
    """The cluster token: a flag beats a variable; a token file beats a token at equal rank.

    Raises:
        ConfigError: the token file is missing, unreadable or empty.
    """
    token, token_src = values["token"]
    path, path_src = values["token_file"]
    use_file = path is not None and (
        token is None or path_src.startswith("--") or token_src[0] == "$"
    )
    if not use_file:
        return token or None
    _readable(path, path_src)
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    if not text:
        raise ConfigError(f"{path_src}: the token file {path} is empty")
    return text
