"""The pure core: typed deployment spec, model and target profiles, sizing and the vLLM command.

Nothing in this package imports Pulumi; scripts and components both build on it. Its modules form
a one-way stack, each importing only its own layer and those below (tests/test_layout.py
``CORE_LAYERS``; docs/ARCHITECTURE.md, "Layers inside the core"): ``errors``; the facts
(``targets``, ``platforms``, ``model``, ``versions``, ...); the typed config (``config/raw``,
``config/spec``, ...); the config's checks (the other modules of ``config/``); the domain over a
spec (``sizing``, ``vllm``, ``weights``, ``time_to_ready``, ...); the checks that need the domain
(``checks``); the entry (``load.parse_spec``, ``load.load_stack``).
"""
