"""Operator scripts (plan, diff, preflight, validate, cost, sweep, weight sync, bench).

Each module keeps ``main(argv) -> int``; ``kimi-deploy <subcommand>`` (components/cli.py) and
``python scripts/<name>.py`` both call it.
"""
