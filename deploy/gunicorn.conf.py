"""gunicorn's settings for the collector behind ``deploy/nginx/spool-collector.conf``.

    gunicorn -c /etc/spool-collector/gunicorn.conf.py

The collector reads its own settings from the environment (``SPOOL_REPORTER_COLLECTOR_DB`` and the others in
docs/collector.md); ``deploy/systemd/spool-collector.service`` sets them. A command-line option overrides the
line here (``--bind 10.0.0.11:8000`` on a host that nginx reaches over the network).
"""

wsgi_app = "spool_reporter.collector.wsgi:application"

# nginx's upstream (deploy/nginx/spool-collector.conf). gunicorn sees nginx's address, never a client's.
bind = ["127.0.0.1:8000"]

# Threaded workers: a request mostly waits for the database. Every process builds its own connections after
# the fork (nothing is preloaded), and counts each event once with the others, on this host or another.
worker_class = "gthread"
workers = 4
threads = 4

# No access log, ever: behind nginx it would hold no client address, but it would hold every request's path
# and query (/mp/collect's carries a GA4 API secret). The error log goes to stderr (the journal under
# systemd); the collector writes there only what concerns the service (a request's data never).
accesslog = None
errorlog = "-"
loglevel = "info"

# The times, against the flusher's (spool_reporter/_settings.py): it reads each answer for at most 10 s and
# runs for at most 20 s. The collector answers a store it cannot reach with 503 and Retry-After within a few
# seconds, and nginx answers for a collector that takes 8 s (proxy_read_timeout), so no request needs more.
timeout = 30  # a worker whose main loop is silent this long is stuck, and replaced (waiting requests are not)
graceful_timeout = 10  # on a reload or stop, the requests under way get this long to finish
keepalive = 2  # nginx opens a connection per request: nothing to keep open

# gunicorn 25.1 and later open a control socket under $HOME or $XDG_RUNTIME_DIR: not needed here, and the
# service's home is read-only. Older versions ignore the setting.
control_socket_disable = True
