"""slurmgate-runc: an OCI runtime wrapper on each Node that holds a marked Pod's containers to
the cores and GPUs its placeholder job got from Slurm (issue 33, slice 3: Kubernetes' half of
the split; slurmd's own cgroups hold the batch jobs, cluster/slurm_cgroups.py).

containerd runs it in runc's place (`BinaryName`, as NVIDIA's container runtime is run) with
the Pod's slurmgate.io/* annotations passed into the container's OCI spec (`pod_annotations`).
On `create` it reads, on this Node only, the placeholder job's cpuset from slurmd's cgroups (and
its GPUs from the job's own environment) and writes them into the spec before runc makes the
container, so the container starts on Slurm's cores and GPUs and never uses any other: no
window between its start and a later fix-up, no call to Slurm or to the API server. Every
other runc call, and every container of an unmarked Pod, goes to runc unchanged.

A marked container is refused (runc never runs) when its job has no cgroup on this Node within
a few seconds, when the job is not the Pod's own (its name, as Slurm started it, must name the
Pod's namespace and name as containerd gives them, not as the Pod's annotations claim), or when
the Pod names a Slurm node this Node does not stand for.
"""
