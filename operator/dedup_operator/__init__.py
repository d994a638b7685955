"""The kopf operator that turns DedupPipeline resources into per-partition workers."""
