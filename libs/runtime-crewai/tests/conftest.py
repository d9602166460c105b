"""CrewAI imported once, before the suite's `filterwarnings = error` applies.

Importing CrewAI 1.15 raises an `ImportWarning` of its own making (`crewai.rag` refuses the
attribute its child module `embeddings` would set): Python ignores that category by default, so
it is silent in a real process, but the suite turns every warning into an error.
"""

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401 - imported for its side effect: the modules are loaded once, quietly
