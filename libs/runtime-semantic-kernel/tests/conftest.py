"""Semantic Kernel is imported as the runtime imports it, before any test module imports it too.

Its OpenAI connector warns as it is first imported (pydantic deprecations of its own), which the
suite's `filterwarnings = error` would turn into a failed collection; the runtime silences them.
"""

from atmosphere.runtimes.semantic_kernel._runtime import import_engine

import_engine()
