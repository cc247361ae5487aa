"""The Airflow benchmark's instrumented sensor, trigger and operator: they stamp wall times into Redis."""

from __future__ import annotations

import time
from typing import Any

MARKS = "fstream-bench:marks:"


# -- instrumented Airflow classes, built on first use (Airflow must not be imported before AIRFLOW_HOME is set) --
def _mark(client: Any, context: Any, name: str, value: Any = None) -> None:
    """Record ``time.time()`` (taken first) or ``value`` under the run's ``bench_id``."""
    now = time.time()
    conf = getattr(context.get("dag_run"), "conf", None) or {}
    bench_id = conf.get("bench_id")
    if bench_id:
        client.hset(MARKS + bench_id, name, repr(now) if value is None else str(value))


def _build_classes() -> dict[str, type]:
    from airflow.sdk.exceptions import TaskDeferred

    from fstream_provider.operators.transfer import FStreamTransferOperator
    from fstream_provider.sensors.new_files import FStreamNewFilesSensor
    from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

    class TimedNewFilesTrigger(FStreamNewFilesTrigger):
        """``FStreamNewFilesTrigger`` that stamps its event with the wall time it was yielded."""

        async def run(self):  # type: ignore[override]
            async for event in super().run():
                event.payload["bench_event_ts"] = time.time()
                yield event

    class TimedNewFilesSensor(FStreamNewFilesSensor):
        """``FStreamNewFilesSensor`` recording when it starts, when its trigger fired and when it resumes."""

        def execute(self, context):
            _mark(self.hook.client, context, "sensor_execute")
            try:
                return super().execute(context)
            except TaskDeferred as d:
                raise TaskDeferred(trigger=TimedNewFilesTrigger(**d.trigger.serialize()[1]),
                                   method_name=d.method_name, kwargs=d.kwargs, timeout=d.timeout) from None

        def execute_complete(self, context, event):
            _mark(self.hook.client, context, "sensor_resume")
            _mark(self.hook.client, context, "trigger_event", event.get("bench_event_ts"))
            out = super().execute_complete(context, event)
            _mark(self.hook.client, context, "sensor_done")
            return out

    class TimedTransferOperator(FStreamTransferOperator):
        """``FStreamTransferOperator`` recording ``execute()`` start, the job id and ``execute_complete`` end."""

        def execute(self, context):
            _mark(self.hook.client, context, "transfer_execute")
            try:
                return super().execute(context)
            except TaskDeferred as d:
                _mark(self.hook.client, context, "job_id", d.trigger.job_id)
                _mark(self.hook.client, context, "transfer_deferred")
                raise

        def execute_complete(self, context, event):
            _mark(self.hook.client, context, "transfer_resume")
            out = super().execute_complete(context, event)
            _mark(self.hook.client, context, "transfer_done")
            _mark(self.hook.client, context, "report_seconds", out.get("seconds"))
            return out

    classes = {"TimedNewFilesTrigger": TimedNewFilesTrigger, "TimedNewFilesSensor": TimedNewFilesSensor,
               "TimedTransferOperator": TimedTransferOperator}
    for name, cls in classes.items():  # importable by classpath (the trigger is re-created from serialize())
        cls.__module__, cls.__qualname__ = "fstream_bench.airflow.timed", name
    return classes


def __getattr__(name: str) -> Any:
    if name in ("TimedNewFilesTrigger", "TimedNewFilesSensor", "TimedTransferOperator"):
        globals().update(_build_classes())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

