"""``python -m tests.real_vllm [--print]``: see ``tests.real_vllm.main``."""

import sys

from tests.real_vllm import main

sys.exit(main())
