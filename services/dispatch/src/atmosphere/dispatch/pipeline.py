"""The old home of `model_side` (kept while `atmosphere.sdk.testing` still imports it from here)."""

from atmosphere.dispatch.model_side import ModelSide as ModelPipeline

__all__ = ["ModelPipeline"]
