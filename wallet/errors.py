"""Every error the wallet package raises, under one root, `WalletError`."""

from __future__ import annotations


class WalletError(Exception):
    """Root of every error raised by the wallet package."""


class WrongPassphraseError(WalletError):
    """The passphrase does not open this key file."""


class KeyFileError(WalletError):
    """A key file that is missing, unreadable or not in the expected format."""
