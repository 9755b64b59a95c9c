"""Published in-flight-batching serving results beside opmap serve's predictions (issue 20). Work in progress."""
