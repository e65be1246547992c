"""What the operator runs: ``kimi-deploy <command>`` (``scripts/cli.py``) or ``python scripts/ops/<name>.py``.

plan, plan_diff (with ``diff/``), preflight, validate, cost, sweep (with ``sweeping/``),
deploy_policy, engine_verify; their shared helpers ``_cli`` and ``_text``; ``vllm_parser``, which
runs ``vllm_argv_check.py`` in the vLLM parser venv (that file stays standalone: it imports only
the standard library and vLLM).
"""
