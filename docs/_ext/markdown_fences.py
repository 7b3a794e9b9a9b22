"""The fenced code blocks of a markdown page, as the docs build (``minicavs_outputs.py``) and
the test suite (``tests/test_docs.py``) both read them; no Sphinx needed."""

import re

FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,}|~{3,})(?P<info>[^\n`]*)$")


def fences(text):
    """The fenced blocks of a markdown page: (info string, body, first line number)."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, info, start = m["ticks"], m["info"].strip(), i + 1
        j = start
        while j < len(lines) and not re.match(rf"^ *{re.escape(ticks[0])}{{{len(ticks)},}}\s*$",
                                              lines[j]):
            j += 1
        body = "\n".join(line[len(m["indent"]):] for line in lines[start:j])
        blocks.append((info, body, start))
        i = j + 1
    return blocks
