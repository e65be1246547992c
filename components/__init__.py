"""kimi-deploy components: the pure deployment core (``spec``) and thin Pulumi edges (``aws``, ``k8s``)."""
