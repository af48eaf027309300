"""The one exception every model-loading failure becomes."""

from __future__ import annotations

import os


class ModelLoadError(ValueError):
    """A model file or folder could not be loaded; str() names the file and the problem.

    A ValueError because the input (the file) is wrong, not the program; callers such as the CLI print it
    as is, so the message must be enough for a user to find the bad file.
    """

    def __init__(self, path: str | os.PathLike[str], message: str):
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")
