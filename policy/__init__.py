"""kimi-deploy guardrails: ``rules`` (plain functions) and the CrossGuard pack (``__main__``)."""
