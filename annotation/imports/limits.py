"""Bounded reading of an uploaded file, and the two ways an import stops without writing.

Reading is bounded (`bounded_lines`): at most IMPORT_MAX_LINE_BYTES per line and
IMPORT_MAX_BYTES per file once decompressed, so a gzip bomb or a line of a gigabyte stops with
`ImportTooLarge` after that many bytes, never holding more than one line in memory.
"""

from collections.abc import Iterator
from typing import IO

from django.conf import settings

BATCH = 500
MAX_ERRORS_REPORTED = 1000


class ImportFailed(Exception):
    """The file had bad lines; nothing was written. `errors` lists (line, message)."""

    def __init__(self, errors: list[tuple[int, str]], total_bad: int):
        self.errors = errors
        self.total_bad = total_bad
        first = "; ".join(f"line {line}: {msg}" for line, msg in errors[:3])
        super().__init__(f"{total_bad} bad line(s); nothing imported ({first})")

    def __reduce__(self):
        return (self.__class__, (self.errors, self.total_bad))


class ImportTooLarge(Exception):
    """The file passed a size limit; reading stopped there and nothing was written."""

    def __init__(self, message: str, *, setting: str, limit: int):
        self.message, self.setting, self.limit = message, setting, limit
        super().__init__(message)

    def __reduce__(self):
        return (_import_too_large, (self.message, self.setting, self.limit))


def _import_too_large(message: str, setting: str, limit: int) -> ImportTooLarge:
    return ImportTooLarge(message, setting=setting, limit=limit)


def size_text(n: int) -> str:
    """Return a byte count as people read it, e.g. '16 MiB (16777216 bytes)'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit} ({n} bytes)"
    return f"{n} bytes"


def bounded_lines(stream: IO) -> Iterator[tuple[int, bytes | str]]:
    """Yield (line number, line) from the stream's position; stop at the size limits.

    ``readline`` is asked for one byte more than a line may hold, so a line without an end
    (a gzip bomb of one character, a 1 GB line) costs at most that much memory before
    `ImportTooLarge` names the limit.
    """
    max_line = settings.IMPORT_MAX_LINE_BYTES
    max_total = settings.IMPORT_MAX_BYTES
    total = number = 0
    while line := stream.readline(max_line + 1):
        number += 1
        total += len(line)
        if total > max_total:
            raise ImportTooLarge(
                f"The file is larger than {size_text(max_total)} once decompressed; "
                "nothing was imported. Split it into smaller files.",
                setting="IMPORT_MAX_BYTES",
                limit=max_total,
            )
        if len(line) > max_line and line[-1:] not in ("\n", b"\n"):
            raise ImportTooLarge(
                f"Line {number} is longer than {size_text(max_line)}; nothing was imported.",
                setting="IMPORT_MAX_LINE_BYTES",
                limit=max_line,
            )
        yield number, line
