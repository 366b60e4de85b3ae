"""Prometheus metrics of the binder."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slurmgate.slurm.restmetrics import RestMetrics
from slurmgate.tenancy_source import PolicyMetrics

REGISTRY = CollectorRegistry()
_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

RECONCILES = Counter("slurmgate_binder_reconciles_total", "Reconciles by decision",
                     ["action"], registry=REGISTRY)
WATCH_EVENTS = Counter("slurmgate_binder_watch_events_total",
                       "Changes seen by the Pod and Node informers (watch events and relists)",
                       ["resource", "type"], registry=REGISTRY)
NODE_SYNCS = Counter("slurmgate_binder_node_syncs_total",
                     "Node cordon/drain comparisons (node sync queue items handled)",
                     registry=REGISTRY)
RECONCILE_ERRORS = Counter("slurmgate_binder_reconcile_errors_total",
                           "Reconciles that failed and were retried", registry=REGISTRY)
BIND_LATENCY = Histogram("slurmgate_binder_running_to_bound_seconds",
                         "From the binder first seeing the job RUNNING to the Pod bound",
                         buckets=_LAT, registry=REGISTRY)
GATE_TO_BIND = Histogram("slurmgate_binder_created_to_bound_seconds",
                         "From Pod creation (gated) to bound", buckets=_LAT, registry=REGISTRY)
EVICTIONS = Counter("slurmgate_binder_evictions_total", "Pods evicted because their job ended",
                    ["reason"], registry=REGISTRY)
CANCELS = Counter("slurmgate_binder_job_cancels_total", "Slurm jobs cancelled", ["why"],
                  registry=REGISTRY)
SLURM_POLLS = Counter("slurmgate_binder_slurm_polls_total", "slurmrestd job polls by outcome",
                      ["outcome"], registry=REGISTRY)
SLURM_POLL_LATENCY = Histogram("slurmgate_binder_slurm_poll_seconds", "slurmrestd job poll",
                               buckets=_LAT, registry=REGISTRY)
JOB_CHANGES = Counter("slurmgate_binder_job_changes_total", "Job changes seen in Slurm",
                      registry=REGISTRY)
GATED = Gauge("slurmgate_binder_gated_pods", "Pods waiting on Slurm", registry=REGISTRY)
STUCK = Gauge("slurmgate_binder_stuck_pods",
              "Pods unbound although their job has been RUNNING for over 30s", registry=REGISTRY)
OVERDUE = Gauge("slurmgate_binder_overdue_pods",
                "Pods still waiting over 5 minutes past the start Slurm expected for them (their "
                "slurmgate.io/expected-start)", registry=REGISTRY)
UNTAINTED = Gauge("slurmgate_binder_untainted_slurm_nodes",
                  "Nodes with a Slurm node label but without the slurmgate.io/slurm-managed "
                  "taint: other Pods may land beside Slurm jobs there", registry=REGISTRY)
LEADER = Gauge("slurmgate_binder_is_leader", "1 while this replica holds the Lease",
               registry=REGISTRY)
NODE_ACTIONS = Counter("slurmgate_binder_node_actions_total", "Slurm node drains/resumes",
                       ["action"], registry=REGISTRY)
SLURM_PUSHES = Counter("slurmgate_binder_slurm_pushes_total",
                       "Job starts/ends pushed by slurmctld's hook, by what the binder did: "
                       "applied (bound at once), early (a start no Pod names yet), applied_late "
                       "(once its Pod was seen), known (a poll was first), polled (an end of "
                       "ours: looked now), reused (an id another claim ran under: left to the "
                       "polls), ignored (not ours), rejected (bad token or body)",
                       ["event", "outcome"], registry=REGISTRY)
TENANCY = PolicyMetrics("binder", REGISTRY)
TENANCY_DENIED = Counter("slurmgate_binder_tenancy_denied_submits_total",
                         "Submits the tenancy policy refused (policy changed after admission)",
                         ["reason"], registry=REGISTRY)
SLURMRESTD = RestMetrics("binder", REGISTRY)
