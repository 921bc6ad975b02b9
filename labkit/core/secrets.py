"""Secrets kept out of what labkit writes and prints: environment variable names that look secret, and the
credentials of a URI (`scheme://user:password@host`). Imports nothing heavy: the command line and the MLflow mirror
use it."""

from __future__ import annotations

import re

SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
_URI_CREDENTIALS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like it holds a secret."""
    return bool(SECRET.search(name))


def redact(text: str) -> str:
    """A message or value with the credentials of every URI in it (`scheme://user:password@`) replaced by `***`."""
    return _URI_CREDENTIALS.sub(r"\1***@", text)
