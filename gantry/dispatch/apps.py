"""The dispatch app's configuration."""

from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "gantry.dispatch"
    label = "dispatch"

    def ready(self) -> None:
        # The queue's gauges come from the database at scrape time, on the
        # registry only /metrics reads (gantry.metrics.SCRAPE_REGISTRY), kept a few
        # seconds (GANTRY_METRICS_CACHE_SECONDS) so scrapers share one set of statements.
        from gantry import metrics
        from gantry.dispatch.demand import QueueCollector

        if not getattr(metrics.SCRAPE_REGISTRY, "_gantry_queue", False):
            metrics.SCRAPE_REGISTRY.register(metrics.CachedCollector(QueueCollector()))
            metrics.SCRAPE_REGISTRY._gantry_queue = True  # type: ignore[attr-defined]
