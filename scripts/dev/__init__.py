"""What a developer of this toolkit runs: the weight-sync benchmark, the dashboard renderer, the
pinned CRDs, the configuration reference, the documents' output blocks and the vLLM venv installers.
"""
