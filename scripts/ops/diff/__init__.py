"""The offline plan diff, split by concern (``scripts/ops/plan_diff.py`` is its command line).

- ``rules``: which input changes replace a resource or disrupt it in place (data, a source per row);
- ``engine``: compare two plan documents (standard library only);
- ``render``: the diff as Markdown (pull-request comment), a rich table, redaction of values;
- ``worktree``: render a stack at a git ref in a temporary ``git worktree``, isolated.
"""
