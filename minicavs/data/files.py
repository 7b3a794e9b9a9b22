"""Text files for the readers: UTF-8 line by line, with errors that name the file and line.

Every text reader (SST, PTB, tagged sentences, word vectors, vocabularies) reads through
:func:`text_lines`, so each refuses the same things the same way: a file that cannot be
opened, a binary file (a NUL byte), bytes that are not UTF-8 (Latin-1, UTF-16); and each
accepts a UTF-8 byte-order mark, which editors on Windows write and which would otherwise
become part of the first word.
"""

import contextlib
import gc

from .tree import DataError

BOM = b"\xef\xbb\xbf"


@contextlib.contextmanager
def collector_paused():
    """Python's cycle collector paused while a dataset's trees are made: every few hundred new
    containers (a tree is dozens of lists) it scanned all the live ones again, a growing
    treebank among them — 35-40 % of reading SST's 8,544 training trees (0.73 -> 0.46 s) and
    of making the synthetic treebank. Trees hold no cycles, so nothing waits to be collected;
    the collector is on again afterwards, as it was."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def text_lines(path):
    """``(line number, text)`` for every line of the UTF-8 file ``path`` (from 1), a leading
    byte-order mark removed. A file that cannot be opened, a NUL byte (a binary file) or a
    line that is not UTF-8 raises :class:`DataError` naming the file, the line and the
    column."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    with f:
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            nul = raw.find(b"\0")
            if nul >= 0:
                raise DataError(f"{path}:{number}:{nul + 1}: a NUL byte: this is a binary "
                                f"file, not text")
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{number}:{exc.start + 1}: byte 0x{raw[exc.start]:02x} "
                                f"is not UTF-8 text; the file must be UTF-8 (convert it with "
                                f"iconv -f <its encoding> -t utf-8)") from None


def read_text(path):
    """The whole UTF-8 file ``path`` (errors as :func:`text_lines`)."""
    return "".join(text for _, text in text_lines(path))
