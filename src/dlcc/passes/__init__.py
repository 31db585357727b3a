"""Graph passes: graph IR -> graph IR, each small, verified and idempotent."""

from dlcc.passes.manager import ManagerOptions, Pass, PassManager, PipelineReport

__all__ = ["ManagerOptions", "Pass", "PassManager", "PipelineReport"]
