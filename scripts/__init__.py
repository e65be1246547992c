"""The programs around the Pulumi program, grouped by who runs them.

- ``cli.py``: ``kimi-deploy``, the one command; it dispatches to the operator's programs.
- ``ops/``: the operator runs them (plan, diff, preflight, validate, cost, sweep, engine verify).
- ``node/``: shipped to and run on a node or inside an image (weight sync, engine cache, API guard,
  engine check); they import only the standard library and each other.
- ``dev/``: a developer of this toolkit runs them (benchmark, dashboard, CRDs, docs, installers).

Each command module keeps ``main(argv) -> int``; ``kimi-deploy <subcommand>`` and
``python scripts/<group>/<name>.py`` both call it.
"""
