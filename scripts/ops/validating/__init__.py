"""Parts of ``scripts/ops/validate.py`` that stand on their own: the statistics its verdicts use
(``stats``) and a byte-timed reader of server-sent event streams (``sse``)."""
