"""The sweeper's parts (``scripts/ops/sweep.py`` is its command line and run loop).

- ``registry``: ``Kind`` (discover, delete, gone, after) and ``Registry`` (the delete order is
  its topological sort);
- ``found``: ``Found``, ``classify`` (ours? expired? retained?) and boto3 helpers;
- ``kinds``: the AWS kinds and ``REGISTRY``.
"""
