"""Text files for the readers: UTF-8 line by line, with errors that name the file and line."""

from .tree import DataError


def text_lines(path):
    """``(line number, text)`` for every line of the UTF-8 file ``path`` (from 1). A file that
    cannot be opened, or a line that is not UTF-8, raises :class:`DataError` naming the file,
    the line and the byte."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    with f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{number}:{exc.start + 1}: byte 0x{raw[exc.start]:02x} "
                                f"is not UTF-8 text; the file must be UTF-8 (convert it with "
                                f"iconv -f <its encoding> -t utf-8)") from None


def read_text(path):
    """The whole UTF-8 file ``path`` (errors as :func:`text_lines`)."""
    return "".join(text for _, text in text_lines(path))
