"""A command under a pseudo-terminal, and what a person would see on that terminal afterwards.

`run_in_terminal` runs a command with its stdin, stdout and stderr on the slave side of a pty (so `isatty()` is true
for all three, as in a shell) and returns every byte it wrote. `Screen` replays those bytes as a terminal would: the
cursor moves, carriage returns, erased lines and wrapped lines that a live display (rich's Live) uses, and keeps
every line ever shown (the scrollback with the screen), colours dropped.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")
OSC = re.compile(r"\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


def run_in_terminal(
    argv: list[str], *, cwd, env: dict[str, str], columns: int = 120, rows: int = 40, timeout: float = 600
) -> tuple[int, bytes]:
    """(exit status, every byte written to the terminal); killed past `timeout` (the status is then negative)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {**env, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(rows)}
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every process holding the slave side has closed it
                    chunk = b""
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None and not _readable(master):
                break
    finally:
        os.close(master)
    return proc.wait(), bytes(out)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0.1)[0])


class Screen:
    """A terminal `columns` wide replaying `data`; `lines` is every line it showed, top to bottom."""

    def __init__(self, data: bytes, *, columns: int = 120):
        self.columns = columns
        self.rows: list[list[str]] = [[]]
        self.row = self.col = 0
        self._feed(OSC.sub("", data.decode("utf-8", errors="replace")))

    @property
    def lines(self) -> list[str]:
        return ["".join(row).rstrip() for row in self.rows]

    def _line(self) -> list[str]:
        while len(self.rows) <= self.row:
            self.rows.append([])
        return self.rows[self.row]

    def _put(self, char: str) -> None:
        if self.col >= self.columns:  # autowrap
            self.row, self.col = self.row + 1, 0
        line = self._line()
        line.extend(" " * (self.col + 1 - len(line)))
        line[self.col] = char
        self.col += 1

    def _feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            char = text[i]
            if char == "\x1b":
                match = CSI.match(text, i)
                if match:
                    self._control(match.group(1), match.group(2))
                    i = match.end()
                    continue
                i += 2  # a two-character escape (charset, keypad mode): nothing shown
                continue
            if char == "\r":
                self.col = 0
            elif char == "\n":
                self.row += 1
                self._line()
            elif char == "\b":
                self.col = max(self.col - 1, 0)
            elif char == "\t":
                self.col = (self.col // 8 + 1) * 8
            elif char >= " ":
                self._put(char)
            i += 1

    def _control(self, params: str, final: str) -> None:
        numbers = [int(p) for p in params.lstrip("?").split(";") if p.isdigit()]
        n = numbers[0] if numbers else None
        if final == "A":
            self.row = max(self.row - (n or 1), 0)
        elif final == "B":
            self.row += n or 1
        elif final == "C":
            self.col += n or 1
        elif final == "D":
            self.col = max(self.col - (n or 1), 0)
        elif final == "G":
            self.col = (n or 1) - 1
        elif final == "K":
            line = self._line()
            if n in (None, 0):
                del line[self.col :]
            elif n == 1:
                line[: self.col] = " " * min(self.col, len(line))
            else:
                line.clear()
        # colours (m), modes (h, l: the cursor shown or hidden) and anything else move nothing
