"""Deployable entrypoint: the memory bank's scheduled upkeep.

Deployed by ``prefect.yaml`` as ``memory-maintenance/nightly`` on a daily cron
schedule. For every user (or one): expire old workspace memories, consolidate
near-duplicates through the update guards, compact the banks, and export a snapshot
whose fingerprint is reported in an artifact (memory contents are never logged).
"""

from autopersona_flows.flows import memory_maintenance

__all__ = ["memory_maintenance"]
