"""Starting the detached flusher (placeholder until the flusher lands: never spawns)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._app import App
    from ._spool import Folder


def maybe_spawn(app: App, folder: Folder, active_size: int, *, long_lived: bool) -> bool:
    """Start a flusher if one is due. Returns whether one was started. Never raises (the hook catches)."""
    return False
