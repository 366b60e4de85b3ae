"""The chaos run (`make chaos`): churn of marked Pods and batch jobs on the local cluster while a
seeded driver kills one component after another; invariants are checked from the outside
(Pods through the API server, jobs through squeue) on every sample, not only at the end.

Files by role: invariants.py (the rules, pure functions over one snapshot), observe.py (taking
snapshots, timing convergence), churn.py (the load), faults.py (what gets killed and how it comes
back), floor.py (the least a run must have done to pass), report.py (the figures),
__main__.py (one run per Slurm release)."""

# What the fault driver kills, one at a time (kept here: __main__ needs the names before the
# modules that read the cluster's port offset may be imported).
FAULTS = ("slurmctld", "slurmrestd", "slurmd", "kube-apiserver", "etcd", "binder", "webhook",
          "parse-worker")
