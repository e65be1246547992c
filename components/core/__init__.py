"""The pure core: typed deployment spec, model and target profiles, sizing and the vLLM command.

Nothing in this package imports Pulumi; scripts and components both build on it.
"""
