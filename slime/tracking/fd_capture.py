"""While the live display is drawn, what reaches file descriptors 1 and 2 is printed above it, not across it.

rich's Live keeps its frame in place by moving the cursor up over the lines it drew last, and Python's writes to
sys.stdout and sys.stderr go through it (redirect_stdout, redirect_stderr). Bytes written to the terminal's
descriptors directly do not: C code of the process (Ray's core worker logs its warnings to fd 2), or a child process
that inherited fd 1 or 2. They land at the cursor, the next redraw moves up too few lines, and a stale frame stays on
the terminal. `FdCapture` points those descriptors at a pipe for the display's time; a thread prints every line that
arrives there through the display's console, which itself writes to a duplicate of the terminal's descriptor.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import IO

from rich.ansi import AnsiDecoder
from rich.console import Console

DRAIN_S = 2.0  # how long `restore()` waits for the last lines once the descriptors are back on the terminal


class FdCapture:
    """Descriptor 1 (and 2 with `stderr`), where it is the terminal `console` draws on, goes through `console` from
    `start()` to `restore()`; `close()` puts the console back on its own file. Off a terminal nothing changes."""

    def __init__(self, console: Console, *, stderr: bool):
        self.console = console
        self.fds = (1, 2) if stderr else (1,)
        self._stream: IO[str] | None = None  # the console's own file while it writes to the duplicate
        self._saved: dict[int, int] = {}  # a captured descriptor -> a duplicate of what it pointed at
        self._reader: threading.Thread | None = None
        self._decoder = AnsiDecoder()

    def start(self) -> None:
        """Point the descriptors that are the console's terminal at a pipe (the console keeps the terminal)."""
        stream = self.console.file
        terminal = _fileno(stream)
        fds = [fd for fd in self.fds if terminal is not None and _same_file(fd, terminal)]
        if self._stream is not None or not fds:
            return
        _flush(stream)  # what Python buffered for the terminal gets there before the swap
        self._stream = stream
        encoding = getattr(stream, "encoding", None) or "utf-8"
        self.console.file = open(os.dup(terminal), "w", encoding=encoding, errors="replace", buffering=1)
        read, write = os.pipe()
        for fd in fds:
            self._saved[fd] = os.dup(fd)
            os.dup2(write, fd)
        os.close(write)
        self._reader = threading.Thread(target=self._forward, args=(read,), name="slime-fd-capture", daemon=True)
        self._reader.start()

    def restore(self) -> None:
        """The descriptors back on the terminal; what they got meanwhile, a partial last line included, is printed
        through the console (above the display while it is drawn)."""
        if not self._saved:
            return
        _flush(self.console.file)
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # closes this write end of the pipe
            os.close(saved)
        self._saved = {}
        if self._reader is not None:
            # The reader ends at end of file; a child process still holding the pipe keeps it open, and the reader
            # then goes on printing the child's lines (to the terminal) until the child closes it.
            self._reader.join(timeout=DRAIN_S)
            self._reader = None

    def close(self) -> None:
        """`restore()`, then the console writes to its own file again and the duplicate is closed."""
        self.restore()
        if self._stream is not None:
            duplicate, self.console.file = self.console.file, self._stream
            self._stream = None
            duplicate.close()

    def _forward(self, read: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read, 65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._print(line)
            if pending:
                self._print(pending)
        finally:
            os.close(read)

    def _print(self, line: bytes) -> None:
        # rich's decoding of a stray sys.stderr line (FileProxy): colours kept, of a line redrawn after carriage
        # returns (a progress bar) the part a terminal would show
        text = self._decoder.decode_line(line.decode(errors="replace").rstrip("\r"))
        try:
            self.console.print(text, soft_wrap=True)
        except Exception:  # the reader must go on reading: writers to fds 1 and 2 would block on a full pipe
            pass


def _flush(stream: IO[str]) -> None:
    """Python's buffers of the descriptors (and the console's own file), written out before a swap."""
    for each in {id(s): s for s in (stream, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s}.values():
        with contextlib.suppress(Exception):
            each.flush()


def _fileno(stream: IO[str]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None


def _same_file(fd: int, other: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.fstat(other))
    except OSError:
        return False
