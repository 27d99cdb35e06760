"""The workers' output: one worker's log, or every worker's interleaved, followed or frozen, searchable,
long lines wrapped to the pane's width (or cut, and scrolled sideways, like `less -S`: `w` toggles).

Drawn with Textual's line API, like toolong's log view: only the lines on screen are rendered, so
thousands of lines a second cost a deque append each and one repaint per batch. Each worker keeps its
last `lines_per_worker` lines and the interleaved view its last `interleaved_lines`: memory stays bounded
however long the run. Lines arrive already masked (RunFeed masks secrets before any widget sees them).
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import deque

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

MAX_WIDTH = 2000  # wider lines are cut: a horizontal scroll bar as wide as a minified blob helps no one
_WORKER_STYLES = [Style(color=c) for c in ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan",
                                           "bright_magenta", "bright_green")]
_ESCAPE_SEQUENCE = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|.)")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
PREFIX_WIDTH = 5  # "[12] " before each line of the interleaved view
_MATCH = Style(bgcolor="yellow", color="black", bold=True)
_CURRENT_MATCH = Style(bgcolor="bright_red", color="white", bold=True)


class LogPane(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    LogPane {
        height: 1fr;
        scrollbar-size-vertical: 1;
        scrollbar-size-horizontal: 1;
    }
    """

    def __init__(self, lines_per_worker: int = 5000, interleaved_lines: int = 20000, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lines_per_worker = lines_per_worker
        self.by_worker: dict[int, deque[str]] = {}
        self.interleaved: deque[tuple[int, str]] = deque(maxlen=interleaved_lines)
        self.worker: int | None = None  # None: every worker, interleaved
        self.follow = True
        self.search_term = ""
        self.matches: list[int] = []  # line indices of the current view that contain the term
        self.current_match: int | None = None  # index into `matches`
        self.wrap = True
        self._width = 0
        # While wrapping: the first screen row of each line of the view, as a running count (an entry
        # per line since the last rebuild; the first `_first` belong to lines the view no longer holds).
        self._starts: list[int] = []
        self._first = 0
        self._rows = 0  # the running count's end
        self._wrap_width = 0

    # -- what is shown ---------------------------------------------------------------------------------

    def view_length(self) -> int:
        return len(self.interleaved) if self.worker is None else len(self.by_worker.get(self.worker, ()))

    def line_at(self, index: int) -> tuple[int, str]:
        if self.worker is None:
            return self.interleaved[index]
        return self.worker, self.by_worker[self.worker][index]

    def visible_text(self) -> list[str]:
        """The lines of the current view as shown (with the worker prefix when interleaved); for tests."""
        return [self._prefix(w) + text for w, text in (self.line_at(i) for i in range(self.view_length()))]

    def add_lines(self, lines: list[tuple[int, str]]) -> None:
        if not lines:
            return
        texts = [text for _, text in lines]
        if "".join(texts).isprintable():  # the usual batch: no line to clean, none redrawn in place
            self._add_printable(lines, texts)
            return
        touches_view = self.worker is None
        length_before = self.view_length()
        added: list[str] = []
        redrawn = False
        for worker, text in lines:
            buffer = self.by_worker.get(worker)
            if buffer is None:
                buffer = self.by_worker[worker] = deque(maxlen=self.lines_per_worker)
            if not text.isprintable():
                if ups := cursor_ups(text):  # a live display redrawn in place (Rich): its rows go first
                    self._take_back(worker, buffer, ups)
                    redrawn = True
                text = printable(text)
            buffer.append(text)
            self.interleaved.append((worker, text))
            if self.worker is None or worker == self.worker:
                added.append(text)
            touches_view = touches_view or worker == self.worker
            if len(text) > self._width:
                self._width = min(len(text), MAX_WIDTH)
        if redrawn:
            self._rebuild_rows()  # lines left the middle of the view: every line's rows again
        elif added and self.wrap:
            self._add_rows(added, length_before)
        if touches_view:
            if self.search_term:
                self._find_matches()
            self._resize()

    def _add_printable(self, lines: list[tuple[int, str]], texts: list[str]) -> None:
        """`add_lines` of lines that need no cleaning: the interleaved view takes them at once."""
        length_before = self.view_length()
        by_worker = self.by_worker
        for worker, text in lines:
            buffer = by_worker.get(worker)
            if buffer is None:
                buffer = by_worker[worker] = deque(maxlen=self.lines_per_worker)
            buffer.append(text)
        self.interleaved.extend(lines)
        added = texts if self.worker is None else [text for worker, text in lines if worker == self.worker]
        if (widest := max(map(len, texts))) > self._width:
            self._width = min(widest, MAX_WIDTH)
        if added and self.wrap:
            self._add_rows(added, length_before)
        if self.worker is None or added:
            if self.search_term:
                self._find_matches()
            self._resize()

    def _take_back(self, worker: int, buffer: deque[str], count: int) -> None:
        """The worker's last `count` lines erased, as a terminal does for a redraw that moves the cursor up
        over them (looked for among the interleaved view's last lines only: a redraw follows its rows)."""
        count = min(count, len(buffer))
        for _ in range(count):
            buffer.pop()
        found = 0
        for index in range(len(self.interleaved) - 1, max(-1, len(self.interleaved) - 1 - 64 * count), -1):
            if found == count:
                break
            if self.interleaved[index][0] == worker:
                del self.interleaved[index]
                found += 1

    def show_worker(self, worker: int | None) -> None:
        self.worker = worker
        self._rebuild_rows()
        if self.search_term:
            self._find_matches()
        self._resize(jump=True)

    def set_wrap(self, wrap: bool) -> None:
        """Long lines wrapped to the width, or cut and scrolled sideways (`less -S`)."""
        self.wrap = wrap
        self._rebuild_rows()
        self.scroll_to(x=0, animate=False, immediate=True)
        self._resize(jump=True)

    # -- wrapping --------------------------------------------------------------------------------------

    def _text_width(self) -> int:
        prefix = 0 if self.worker is not None else PREFIX_WIDTH
        return max(10, self.size.width - 1 - prefix)  # the vertical scroll bar's column

    def _rows_of(self, text: str) -> int:
        return max(1, -(-min(len(text), MAX_WIDTH) // self._wrap_width))

    def _rebuild_rows(self) -> None:
        self._wrap_width = self._text_width()
        self._starts, self._first, self._rows = [], 0, 0
        if self.wrap:
            self._add_rows([self.line_at(i)[1] for i in range(self.view_length())], 0)

    def _add_rows(self, texts: list[str], length_before: int) -> None:
        if self._wrap_width != self._text_width():
            self._rebuild_rows()  # the width changed since: every line's rows again, this batch included
            return
        width = self._wrap_width
        # each line's rows: _rows_of, inline (thousands of lines a second)
        rows = [max(1, -(-min(len(text), MAX_WIDTH) // width)) for text in texts]
        self._starts.extend(itertools.accumulate(rows, initial=self._rows))
        self._rows = self._starts.pop()
        # lines the view's bounded buffer let go of
        self._first += max(0, length_before + len(texts) - self.view_length())
        if self._first > 50_000:
            del self._starts[: self._first]
            self._first = 0

    def row_count(self) -> int:
        """How many screen rows the view takes."""
        if not self.wrap or not self._starts:
            return self.view_length()
        return self._rows - self._starts[self._first]

    def row_of_line(self, index: int) -> int:
        """The first screen row of the view's line `index`."""
        if not self.wrap or not self._starts:
            return index
        return self._starts[self._first + index] - self._starts[self._first]

    def line_of_row(self, row: int) -> tuple[int, int]:
        """(the view's line, which of its wrapped pieces) at screen row `row`."""
        if not self.wrap or not self._starts:
            return row, 0
        absolute = self._starts[self._first] + row
        at = bisect.bisect_right(self._starts, absolute, lo=self._first) - 1
        return at - self._first, absolute - self._starts[at]

    def set_follow(self, follow: bool) -> None:
        self.follow = follow
        if follow:
            self.scroll_end(animate=False, immediate=True)
        self.refresh()

    def on_resize(self) -> None:
        if self.wrap and self._wrap_width != self._text_width():
            self._rebuild_rows()
            self._resize()
        if self.follow:  # lines that arrived before the pane had a size must still end at the bottom
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    # -- search ----------------------------------------------------------------------------------------

    def search(self, term: str) -> int:
        """Highlight `term` (case-insensitive) and jump to its last occurrence; the match count."""
        self.search_term = term
        self._find_matches()
        if self.matches:
            self._go_to_match(len(self.matches) - 1)
        else:
            self.current_match = None
            self.refresh()
        return len(self.matches)

    def next_match(self, step: int = 1) -> None:
        if not self.matches:
            return
        current = self.current_match if self.current_match is not None else len(self.matches) - 1
        self._go_to_match((current + step) % len(self.matches))

    def _go_to_match(self, position: int) -> None:
        self.current_match = position
        self.follow = False  # reading a match: new lines must not scroll it away
        line = self.row_of_line(self.matches[position])
        self.scroll_to(y=max(0, line - self.size.height // 2), animate=False, immediate=True)
        self.refresh()

    def _find_matches(self) -> None:
        term = self.search_term.lower()
        was = self.matches[self.current_match] if self.current_match is not None and self.matches else None
        lines = range(self.view_length()) if term else range(0)
        self.matches = [i for i in lines if term in self.line_at(i)[1].lower()]
        if was is not None and self.matches:
            self.current_match = min(range(len(self.matches)), key=lambda p: abs(self.matches[p] - was))
        elif not self.matches:
            self.current_match = None

    # -- drawing ---------------------------------------------------------------------------------------

    def _resize(self, jump: bool = False) -> None:
        prefix = 0 if self.worker is not None else PREFIX_WIDTH
        width = self.size.width - 1 if self.wrap else self._width + prefix
        self.virtual_size = Size(width, self.row_count())
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        elif jump:
            self.scroll_to(y=min(self.scroll_y, max(0, self.row_count() - 1)), animate=False)
        self.refresh()

    def _prefix(self, worker: int) -> str:
        return "" if self.worker is not None else f"[{worker}]".ljust(5)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if scroll_y + y >= self.row_count():
            return Strip.blank(width, self.rich_style)
        index, piece = self.line_of_row(scroll_y + y)
        worker, text = self.line_at(index)
        segments = []
        if self.worker is None:
            prefix = self._prefix(worker) if piece == 0 else " " * PREFIX_WIDTH
            segments.append(Segment(prefix, _WORKER_STYLES[worker % len(_WORKER_STYLES)]))
        line = Strip(self._highlighted(text, index))
        if self.wrap:
            start = piece * self._wrap_width
            line = line.crop(start, start + self._wrap_width)
            scroll_x = 0
        strip = Strip([*segments, *line]).crop(scroll_x, scroll_x + width)
        return strip.extend_cell_length(width, self.rich_style).apply_style(self.rich_style)

    def _highlighted(self, text: str, index: int) -> list[Segment]:
        text = text[:MAX_WIDTH]
        term = self.search_term.lower()
        if not term or term not in text.lower():
            return [Segment(text)]
        current = self.current_match is not None and self.matches[self.current_match] == index
        style = _CURRENT_MATCH if current else _MATCH
        segments, lowered, start = [], text.lower(), 0
        while (found := lowered.find(term, start)) >= 0:
            segments.append(Segment(text[start:found]))
            segments.append(Segment(text[found : found + len(term)], style))
            start = found + len(term)
        segments.append(Segment(text[start:]))
        return segments


_CURSOR_UP = re.compile(r"\x1b\[(\d*)A")


def cursor_ups(line: str) -> int:
    """How many rows up the line's last redraw moves the cursor before it writes (`ESC[nA` after its last
    carriage return): the rows a live display (Rich's) takes back to draw its next frame."""
    redraw = line.rpartition("\r")[2]
    return sum(int(n or 1) for n in _CURSOR_UP.findall(redraw))


def printable(line: str) -> str:
    """What a terminal would leave of the line: the text after its last carriage return (a progress bar's
    final state), tabs as spaces, colour codes and other control characters dropped. Written to the screen
    as-is, they would move the cursor and tear the dashboard apart."""
    line = _ESCAPE_SEQUENCE.sub("", line)
    if "\r" in line:
        line = next((part for part in reversed(line.split("\r")) if part), "")
    return _CONTROL.sub("", line.expandtabs(4))


class LogStatus(Static):
    """One line above the log: whose output, whether it follows, and the search."""

    DEFAULT_CSS = """
    LogStatus {
        height: 1;
        padding: 0 1;
        background: $boost;
        color: $text-muted;
    }
    """

    def show(self, pane: LogPane, worker_count: int) -> None:
        who = "all workers, interleaved" if pane.worker is None else f"worker {pane.worker}"
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"log: {who}", style="bold")
        text.append(f"  ({pane.view_length()} lines)  ")
        text.append(
            "follow on" if pane.follow else "follow OFF", style="green" if pane.follow else "bold yellow"
        )
        if pane.search_term:
            found = len(pane.matches)
            at = f" ({pane.current_match + 1}/{found})" if pane.current_match is not None else ""
            text.append(
                f"  /{pane.search_term}: {found} match{'es' if found != 1 else ''}{at}",
                style="yellow" if found else "red",
            )
        text.append("  wrap" if pane.wrap else "  cut (w wraps)", style="dim")
        hint = "  0-9 worker  tab next  a all  f follow  w wrap  / search"
        if pane.search_term:
            hint += "  n/N next/prev"
        text.append(hint if worker_count else "", style="dim")
        self.update(text, layout=False)  # one row whatever it says: no layout of the screen for it
