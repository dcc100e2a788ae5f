"""Where spool_reporter keeps things, computed without importing :mod:`platformdirs`.

The hook runs inside every reported command, and importing ``platformdirs`` costs about 2 ms there (see
docs/design-notes.md). These few functions reproduce its answers for the three directories we use:

* ``user_config_dir()``  -> platformdirs ``user_config_dir()`` (the folder that holds ``djangoanalytics``);
* ``site_config_dir()``  -> platformdirs ``site_config_dir()`` (where a distributor's policy file lives);
* ``user_state_dir(app)`` -> platformdirs ``user_state_dir(app, appauthor=False)``.

``tests/test_paths.py`` checks each one against ``platformdirs`` itself under many environments, so the hook,
the flusher and the command line always agree on the same files.

The code lives in :mod:`spool_reporter._hot`, the one module the hook path imports; this module names it.
"""

from __future__ import annotations

from ._hot import (
    site_config_dir,
    site_config_dirs,
    user_config_dir,
    user_state_dir,
)

__all__ = [
    "site_config_dirs",
    "site_config_dir",
    "user_config_dir",
    "user_state_dir",
]
