"""The one exception type the CLI turns into a one-line message and exit status 2."""


class OpmapError(Exception):
    """Bad input or an impossible request: the message names what was wrong and what is accepted."""
