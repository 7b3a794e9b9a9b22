"""Where in the user's code something happened: errors point at the user's own line.

``user_location()`` is the innermost stack frame outside the minicavs package — the line of the
model that called the op, traced the cell or made the parameter; ``format_location`` renders it
for a message (``\\n  at file:line: code``). Every layer that raises about a user's line uses
these two.
"""

import linecache
import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_location():
    """(file, line) of the innermost stack frame outside the minicavs package, or None."""
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno


def format_location(where):
    """``where`` (from :func:`user_location`) as the tail of a message; "" for None."""
    if where is None:
        return ""
    filename, line = where
    code = linecache.getline(filename, line).strip()
    return f"\n  at {filename}:{line}: {code}" if code else f"\n  at {filename}:{line}"
