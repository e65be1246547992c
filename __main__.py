"""kimi-deploy: the Pulumi program. Everything lives in ``components``; see README.md."""

from components.program import main

main()
