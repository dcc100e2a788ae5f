"""Which store a ``--db`` value names: :func:`open_store`, the one module that knows both back ends.

:mod:`._store` is the interface and :mod:`._sqlite` and :mod:`._postgres` implement it; the factory lives here,
above all three, so that the interface imports neither implementation. Each back end is imported only when a
database of its kind is opened: a SQLite collector never imports the PostgreSQL code, nor psycopg.
"""

from __future__ import annotations

from ._common import Limits, is_postgres
from ._store import Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    import os


def open_store(db: str | os.PathLike[str], *, create: bool = True, limits: Limits | None = None) -> Store:
    """The store named by ``db``: a ``postgresql://`` URL, or a SQLite file path.

    :param create: create the database's tables (and a missing SQLite file), and migrate an older schema;
        otherwise a missing SQLite file raises :class:`~._common.CollectorError` (``stats`` never creates an empty
        database by mistake) -- an older schema is still read.
    :raises CollectorError: with one line saying why the database cannot be used.
    """
    if is_postgres(db):
        from ._postgres import PostgresStore

        return PostgresStore(str(db), create=create, limits=limits or Limits())
    from ._sqlite import SQLiteStore

    return SQLiteStore(db, create=create, limits=limits or Limits())
