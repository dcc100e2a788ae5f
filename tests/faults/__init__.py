"""The fault and load suite (``nox -s faults``): DESIGN.md's failure model injected with real processes, files,
signals and loopback servers. ``SPOOL_FAULTS_SCALE=full`` runs the published trial counts."""
