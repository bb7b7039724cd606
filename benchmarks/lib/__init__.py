"""Parts the benchmark scripts share: the data, the machine, the server as a subprocess, clients.

The scripts run as `python benchmarks/<script>.py`, so they import these as `lib.<module>`; the
tests import them as `benchmarks.lib.<module>`. Each module imports only the standard library,
third-party packages and its siblings (relatively), so that both names work.
"""
