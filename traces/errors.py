"""Errors a user can cause. The CLI prints them as one line; the server answers 4xx."""


class UserError(Exception):
    """Bad input or a request that cannot be met. `exit_code` is what the CLI returns."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
