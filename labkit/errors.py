"""The one error type of labkit: `LabkitError` and its subclasses.

Every error a user can act on is a `LabkitError` whose message is one line naming the file, line,
key or run and the fix. The `labkit` command prints it as that line (no traceback) and exits with the
error's `exit_code`: 2 for bad input (a card, a data file, a model source, a command's arguments, a run
in the wrong state), 1 when a stage or a check failed on valid input. Anything else is a bug and keeps
its traceback.

The subclasses also derive from the built-in exception they replace (ValueError, FileNotFoundError, …),
so code that catches those keeps working.
"""

from __future__ import annotations


class LabkitError(Exception):
    """An error the user can act on; its message is one line."""

    exit_code = 2


class CardError(LabkitError, ValueError):
    """A card that cannot be used; the message is one line naming the file and the key."""


class DataError(LabkitError, ValueError):
    """Bad input data; the message is one line naming the place and the fix."""


class LeakageError(DataError):
    """Train/eval duplicates found under the card's `fail` policy."""


class ModelSourceError(LabkitError, ValueError):
    """A model source that cannot be parsed, fetched, verified or loaded (one-line message)."""


class MethodError(LabkitError, ValueError):
    """A method that cannot be applied (e.g. target modules that match nothing)."""


class UsageError(LabkitError, ValueError):
    """A command called with arguments that do not fit together (one line: what to pass instead)."""


class RunStateError(LabkitError, ValueError):
    """A run that is not in the state a command needs (still running, not completed, made from another card…)."""


class MissingInput(LabkitError, FileNotFoundError):
    """A file or folder a command needs does not exist (a run, its data, the notebooks…)."""


class RegistryCorrupt(LabkitError, ValueError):
    """A line of registry.jsonl that is not a JSON event (named by its line number; never skipped silently)."""


class SplitLocked(LabkitError, PermissionError):
    """The test split is locked: it opens once, through `labkit final`."""


class CorruptFile(LabkitError, ValueError):
    """A file labkit wrote (status.json, a stage's results) that cannot be read back: one line naming it and the fix."""


class StorageError(LabkitError, OSError):
    """A file could not be written (disk full, read-only file system, no permission): one line naming it."""

    exit_code = 1


class ExportRefused(LabkitError, ValueError):
    """A run that cannot be exported (one line: which run, which status, what to do)."""


class PreprocessingCheckFailed(LabkitError, RuntimeError):
    """A preprocessing check failed; the message names the check and the offending row ids."""

    exit_code = 1


class ExportCheckFailed(LabkitError, RuntimeError):
    """The reload check of an export failed; the export stays on disk for inspection."""

    exit_code = 1


class StageFailed(LabkitError, RuntimeError):
    """A stage notebook raised; the run is marked failed and the executed notebook kept."""

    exit_code = 1


class StageInterrupted(StageFailed):
    """The training stage stopped on a signal after writing a checkpoint; the run is marked interrupted."""


class NonFiniteError(LabkitError, FloatingPointError):
    """A loss, gradient norm, logit or score that is NaN or infinite: one line naming where (step, row) and the fix.
    Training stops on it and evaluation never turns it into a score."""

    exit_code = 1


class TrainingInterrupted(LabkitError, RuntimeError):
    """Training stopped on a signal after writing a checkpoint."""

    exit_code = 1
