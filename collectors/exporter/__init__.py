"""exporter collector: scrape dcgm-exporter / DOCA Telemetry Service Prometheus endpoints and map
their series to skewd signals through a YAML mapping file."""
from .collector import ExporterCollector

COLLECTOR = ExporterCollector

__all__ = ["COLLECTOR", "ExporterCollector"]
