"""The nightly evaluation of the active index."""

from __future__ import annotations

import dagster as dg

from evidence_pipeline.orchestration.jobs import evaluate_active_job

nightly_evaluation = dg.ScheduleDefinition(
    name="nightly_evaluation", job=evaluate_active_job, cron_schedule="0 3 * * *",
    execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every night: evaluation.yaml against the active generation; the report is "
                "recorded on active_index_evaluation.")
