"""The log pane keeps what a terminal would show of a live display redrawn in place: Lightning's Rich bar
(its real recorded output) moves the cursor up over its last frame's rows before drawing the next, so the
pane ends with the last frame, not a line per frame; two workers' redraws interleaved each take back only
their own rows."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult

from tpu_console.tui.widgets.log_pane import LogPane, cursor_ups

RECORDING = Path(__file__).parents[1] / "worker" / "program_outputs" / "lightning.log"


class PaneApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LogPane()


def test_cursor_ups_counts_the_last_redraws_moves_only():
    assert cursor_ups("plain") == 0
    assert cursor_ups("row two\r\x1b[2K\x1b[1A\x1b[2KEpoch 0/2 1/16") == 1
    assert cursor_ups("\x1b[3A old\r\x1b[2A\x1b[Anew") == 3  # ESC[A is one row; before the last \r: gone
    assert cursor_ups("\x1b[2Kjust erased") == 0


async def test_lightnings_rich_bar_leaves_its_last_frame_as_a_terminal_would():
    lines = RECORDING.read_bytes().decode().split("\n")
    async with PaneApp().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one(LogPane)
        for start in range(0, len(lines), 7):  # in batches, as the feed delivers them
            pane.add_lines([(0, line) for line in lines[start:start + 7]])
        await pilot.pause()
        shown = pane.visible_text()
    bars = [line for line in shown if "Epoch" in line]
    assert len(bars) == 2 and all("Epoch 2/2" in line and "16/16" in line for line in bars), bars
    assert "train_loss: 0.111" in shown[-3] and "val_loss: 0.153" in shown[-2]
    assert len(shown) < 40  # the recording's 152 lines, its ~100 frames taken back


async def test_two_workers_redraws_each_take_back_their_own_rows():
    async with PaneApp().run_test(size=(120, 40)) as pilot:
        pane = pilot.app.query_one(LogPane)
        pane.add_lines([(0, "w0 frame 1"), (1, "w1 frame 1")])
        pane.add_lines([(0, "\r\x1b[2K\x1b[1A\x1b[2Kw0 frame 2"), (1, "w1 plain line")])
        pane.add_lines([(1, "\r\x1b[1A\x1b[2Kw1 frame 2")])
        await pilot.pause()
        assert pane.visible_text() == ["[1]  w1 frame 1", "[0]  w0 frame 2", "[1]  w1 frame 2"]
        pane.show_worker(0)
        assert pane.visible_text() == ["w0 frame 2"]
