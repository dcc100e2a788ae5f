"""What the tests share: loopback servers, a throw-away PostgreSQL, headless Chromium, polling, the sandbox of
a test and the unprivileged user. Plain modules, imported as ``from support.servers import serving``; the
fixtures are in :mod:`support.fixtures`, which ``tests/conftest.py`` registers for every test."""
