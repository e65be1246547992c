"""What runs on a node (or inside a candidate vLLM image), shipped there as files.

``weight_sync/`` (a package, shipped as one zipapp: ``components/sync_artifact.py``),
``engine_cache.py``, ``kimi_vllm_api_guard.py`` (imported by vLLM) and ``engine_check.py`` (run
inside a candidate image by ``kimi-deploy engine verify``). Each imports only the standard library
and its own siblings here, with the image's packages (boto3, huggingface_hub, vLLM...) imported
where used: nothing from ``components/`` or the other ``scripts/`` groups (tests/test_layout.py).
"""
