"""DedupPipeline bodies for the operator's integration tests (dedup_local.pipelines)."""

from dedup_local.pipelines import WORKER_ON_CLUSTER as WORKER_ON_CLUSTER
from dedup_local.pipelines import cluster_pipeline_body as cluster_pipeline_body
from dedup_local.pipelines import pipeline_body as pipeline_body
