"""Deployable entrypoint: one person's memories as a markdown artifact, for review.

Deployed by ``prefect.yaml`` as ``memory-review/review``, paused: artifacts are
visible to everyone in the workspace, so someone turns it on deliberately.
"""

from autopersona_flows.flows.review import memory_review

__all__ = ["memory_review"]
