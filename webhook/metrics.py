"""Prometheus metrics of the webhook (its own registry, served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from slurmgate.slurm.restmetrics import RestMetrics
from slurmgate.tenancy_source import PolicyMetrics

REGISTRY = CollectorRegistry()
# finer between 50 and 250 ms, where a SUBMIT_BUDGET usually lies and the admission tail is
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25,
         0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS = Counter("slurmgate_webhook_requests_total", "AdmissionReview requests by HTTP code",
                   ["code"], registry=REGISTRY)
LATENCY = Histogram("slurmgate_webhook_request_duration_seconds",
                    "Time to answer an AdmissionReview", ["marked"], buckets=_FAST,
                    registry=REGISTRY)
DECISIONS = Counter("slurmgate_webhook_decisions_total",
                    "Outcome per request (untouched, gated, denied, dry_run, ...)",
                    ["decision"], registry=REGISTRY)
DENIALS = Counter("slurmgate_webhook_denials_total", "Denied Pods by reason", ["reason"],
                  registry=REGISTRY)
DUPLICATES = Counter("slurmgate_webhook_duplicate_reviews_total",
                     "Reviews answered from the dedup cache (same request uid)",
                     registry=REGISTRY)
SUBMIT_LATENCY = Histogram("slurmgate_slurm_submit_duration_seconds",
                           "slurmrestd job submit latency", buckets=_FAST, registry=REGISTRY)
SUBMIT_ERRORS = Counter("slurmgate_slurm_submit_errors_total",
                        "Submits that Slurm refused or did not answer", registry=REGISTRY)
HANDOFFS = Counter("slurmgate_webhook_submit_handoffs_total",
                   "Pods admitted before Slurm answered their submit (past the submit budget; "
                   "the binder adopts the job)", registry=REGISTRY)
INVENTORY_ERRORS = Counter("slurmgate_inventory_refresh_errors_total",
                           "Failed refreshes of the Slurm/Kubernetes node inventory",
                           registry=REGISTRY)
TENANCY = PolicyMetrics("webhook", REGISTRY)
ORPHANS_CANCELLED = Counter("slurmgate_webhook_orphan_jobs_cancelled_total",
                            "Jobs the webhook submitted whose Pod was never stored (refused after "
                            "admission): cancelled by the webhook", registry=REGISTRY)
SLURMRESTD = RestMetrics("webhook", REGISTRY)
