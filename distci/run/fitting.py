"""Text fitted to a width: the terminal's one set of rules for shortening and wrapping.

Every line `distci run`, the gate and the errors print goes through these: ids are
shortened so what tells two apart stays (a test id keeps its file stem, function and
parametrization; a cell tag keeps its versions), prose is wrapped at spaces, commands
are wrapped as pasteable shell lines. Pure functions of their text and width.
"""

from __future__ import annotations

import shlex
import shutil

DEFAULT_COLUMNS = 80
MIN_COLUMNS = 40
CELL_TAG_CHARS = 28  # a cell id in a line's `[cell] ` tag; the full id has its own line
ELLIPSIS = "..."  # ASCII: a CI log in a C locale must not fail on it


def columns() -> int:
    """The width every line is fitted to: $COLUMNS, else the terminal's, else 80."""
    return max(MIN_COLUMNS, shutil.get_terminal_size((DEFAULT_COLUMNS, 24)).columns)


def shorten(text: str, width: int, *, head: float = 0.4) -> str:
    """`text` in at most `width` characters, its middle replaced by `...`.

    The tail gets the larger share: a test id's parametrization (`[bf16-compile]`) and
    a cell id's last axes are what tell two lines apart; the head keeps the file.
    """
    if len(text) <= width:
        return text
    if width <= len(ELLIPSIS):
        return text[:width]
    keep = width - len(ELLIPSIS)
    front = int(keep * head)
    return text[:front] + ELLIPSIS + text[len(text) - (keep - front):]


WRAP_INDENT = "    "


def wrap(line: str, width: int) -> list[str]:
    """`line` as lines of at most `width`: broken at the last space that fits (else at
    the width), continuations indented by WRAP_INDENT."""
    out: list[str] = []
    rest = line.rstrip()
    while len(rest) > width:
        start = len(rest) - len(rest.lstrip()) + 1  # a break leaves words on the line, not only indent
        cut = rest.rfind(" ", start, width + 1)
        if cut < start:
            cut = width
        out.append(rest[:cut].rstrip())
        rest = WRAP_INDENT + rest[cut:].lstrip()
    return out + [rest]


# How a cell id's parts read in a tag: the versions stay, their axis names shrink.
_TAG_PREFIXES = (("torch_", "t"), ("ao_", "ao"), ("titan_", "tt"), ("npu_compat", "npu"), ("fix_", ""))
_TAG_WORDS = {"nightly": "nt", "installed": "inst"}


def cell_tag(cell_id: str) -> str:
    """`[cpu-t2.13.0-ao0.18.0-ws2-on] `: the prefix of every line about one cell.

    The versions are what tell nightly cells apart, so they stay: the tag is the
    accelerator, then the id's parts from torch on with their axis names abbreviated
    (the variant and arch, which the accelerator implies, are left out). An id of
    another shape is shortened from the middle."""
    parts = cell_id.split("-")
    start = next((i for i, p in enumerate(parts) if p.startswith("torch_")), None)
    if start is None:
        return f"[{shorten(cell_id, CELL_TAG_CHARS)}] "
    short = [parts[0]]
    for part in parts[start:]:
        for prefix, abbrev in _TAG_PREFIXES:
            if part.startswith(prefix):
                rest = part[len(prefix):]
                part = abbrev + _TAG_WORDS.get(rest, rest)
                break
        short.append(part)
    return f"[{shorten('-'.join(short), CELL_TAG_CHARS, head=0.6)}] "


def shorten_test_id(test_id: str, width: int) -> str:
    """A pytest node id in at most `width` characters that still names its file stem, its
    function and its parametrization, as far as the width allows.

    Dropped in this order, each only while the id is too long: the `suites/` root,
    the `.py` suffix, the folders, the middle of the function name (its head and tail
    stay), the middle of the file stem; only then is the whole shortened from the middle."""
    if len(test_id) <= width:
        return test_id
    path, sep, rest = test_id.partition("::")
    func, bracket, params = rest.partition("[")
    params = bracket + params
    steps = [lambda p: p.removeprefix("suites/"), lambda p: p.removesuffix(".py"), lambda p: p.rsplit("/", 1)[-1]]
    for step in steps:
        path = step(path)
        candidate = path + sep + func + params
        if len(candidate) <= width:
            return candidate
    fixed = len(path) + len(sep) + len(params)
    min_func = min(len(func), 2 * len(ELLIPSIS) + 1)
    if fixed + min_func <= width:
        return path + sep + shorten(func, width - fixed, head=0.5) + params
    whole_func, func = func, shorten(func, min_func, head=0.5)
    fixed = len(sep) + len(func) + len(params)
    min_path = min(len(path), 2 * len(ELLIPSIS) + 1)
    if fixed + min_path <= width:
        return shorten(path, width - fixed, head=0.5) + sep + func + params
    if len(params) + min_path <= width:  # the parametrization is what tells two lines apart: keep it whole
        return shorten(path + sep + whole_func, width - len(params), head=0.5) + params
    return shorten(shorten(path, min_path, head=0.5) + sep + func + params, width)


def command_lines(cmd: list[str], width: int, *, indent: str = "", prompt: str = "$") -> list[str]:
    """`$ cmd ...` as shell lines of at most `width`, joined by ` \\` continuations: a long
    command stays pasteable. A word longer than a line is cut into quoted pieces joined
    by a backslash-newline at column 0 (inside a word, leading spaces would split it),
    which the shell puts back together."""
    cont = indent + "    "
    lines: list[str] = []
    line = indent + prompt
    for word in cmd:
        quoted = shlex.quote(word)
        sep = " " if line.strip() else ""
        if len(line) + len(sep) + len(quoted) + 2 <= width:
            line += sep + quoted
            continue
        if line.strip():
            lines.append(line + " \\")
            line, sep = cont, ""
        if len(line) + len(quoted) + 2 <= width:
            line += quoted
            continue
        rest = word
        while rest:
            room = width - len(line) - 1
            n = max(1, room - 2)
            while n > 1 and len(shlex.quote(rest[:n])) > room:
                n -= 1
            if n >= len(rest):
                line += shlex.quote(rest)
                break
            lines.append(line + shlex.quote(rest[:n]) + "\\")
            line, rest = "", rest[n:]
    return lines + [line]


def short_run_id(run_id: str, cell_id: str, width: int) -> str:
    """A run id within `width`: past it, its cell part (printed on its own line) becomes
    `*`, which a shell still expands to the one run directory."""
    suffix = "-" + cell_id
    if len(run_id) > width and run_id.endswith(suffix):
        return run_id[: -len(suffix)] + "-*"
    return run_id


def fit_text(text: str, width: int | None = None) -> str:
    """A report (the gate's, say) within `width` (default: columns()): prose lines wrapped
    at spaces, a `repro: COMMAND` line as pasteable shell lines under its label."""
    width = width or columns()
    out: list[str] = []
    for line in text.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        body = line.strip()
        if body.startswith("repro: ") and len(line) > width:
            try:
                words = shlex.split(body[len("repro: "):])
            except ValueError:
                words = []
            if words:
                out.append(indent + "repro:")
                out += command_lines(words, width, indent=indent + "  ", prompt="")
                continue
        out += wrap(line, width)
    return "\n".join(out)
