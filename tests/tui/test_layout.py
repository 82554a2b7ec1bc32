"""Every screen fits an 80×24 terminal: the footer (the key map) on the last row, the approval buttons
and the dialog fully visible, the studies table without sideways scrolling."""

from __future__ import annotations

from textual.geometry import Region
from textual.widget import Widget
from textual.widgets import Button, DataTable, Footer, Input

from a3r.app.tui import A3RApp, DecisionDialog, TuiConfig
from a3r.app.tui._approvals_screen import ApprovalsScreen
from a3r.app.tui._findings_screen import FindingsScreen
from a3r.app.tui._patch_screen import PatchScreen
from a3r.app.tui._run_screen import RunScreen
from a3r.app.tui._study_screen import StudyScreen
from memory import Store
from tests.tui.conftest import Seeded, cells, wait_for

TERMINAL = Region(0, 0, 80, 24)


def _visible(widget: Widget) -> bool:
    return TERMINAL.contains_region(widget.region) and widget.region.area > 0


async def test_screens_fit_80x24(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    app = A3RApp(store, config=config)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: cells(app, "#studies"))
        table = app.screen.query_one("#studies", DataTable)
        assert table.virtual_size.width <= table.size.width, "the studies table scrolls sideways"
        expected = [StudyScreen, RunScreen, FindingsScreen, ApprovalsScreen, PatchScreen]
        for keys, screen_type in zip(
            (("enter",), ("enter",), ("f",), ("p",), ("enter",)), expected, strict=True
        ):
            await pilot.press(*keys)
            await pilot.pause(0.2)
            assert isinstance(app.screen, screen_type)
            footer = app.screen.query_one(Footer)
            assert footer.region == Region(0, 23, 80, 1), f"{screen_type.__name__}: footer at {footer.region}"
            for table in app.screen.query(DataTable):
                if table.display and table.row_count:
                    assert table.virtual_size.width <= table.size.width, f"{table.id} scrolls sideways"
        for button in app.screen.query(Button):
            assert _visible(button), f"button {button.id} at {button.region} is cut off"
        await pilot.press("r")
        dialog = app.screen
        assert isinstance(dialog, DecisionDialog)
        await pilot.pause(0.1)
        for widget in (dialog.query_one("#dialog"), dialog.query_one(Input), *dialog.query(Button)):
            assert _visible(widget), f"{widget!r} at {widget.region} is cut off"
