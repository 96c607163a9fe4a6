"""Every error the node package raises, under one root, `NodeError`."""

from __future__ import annotations


class NodeError(Exception):
    """Root of every error raised by the node package."""


class DataDirError(NodeError):
    """A data directory that is missing, uninitialised, locked or damaged."""


class ChainLockedError(DataDirError):
    """The data dir's chain store is open in another process (a running node)."""


class ChainCorruptError(DataDirError):
    """A chain store that opens but contradicts itself (damaged or tampered)."""


class KeyFileError(NodeError):
    """A key file that is missing, unreadable or not in the expected format."""


class WrongPassphraseError(NodeError):
    """The passphrase does not open this key file."""


class ProofError(NodeError):
    """A proof file that cannot be read, or a receipt that is not in the log."""


class PlacementError(NodeError, ValueError):
    """An input span placement cannot use: a layer count, span length or gain out of range."""


class BadRequest(NodeError):
    """Arguments a control op or a chain view cannot use (the control socket answers its text)."""


class MinerError(NodeError):
    """A job this node cannot mine (its commitments or partition do not match)."""


class NothingToMine(MinerError):
    """The chain has no job this node can mine now (the reason says why)."""


class DataUnavailable(MinerError):
    """A job's data file is on no reachable peer, or every copy had another hash."""


class BadPush(MinerError):
    """A pushed `StepTensors` that does not fit the job (the pusher is scored)."""
