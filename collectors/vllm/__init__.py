"""vllm collector: scrape vLLM engines' Prometheus /metrics (old and new metric names)."""
from .collector import VllmCollector

COLLECTOR = VllmCollector

__all__ = ["COLLECTOR", "VllmCollector"]
