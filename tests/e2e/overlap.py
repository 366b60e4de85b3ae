"""The core invariant on a real Node, read from the processes themselves: a Pod's containers
(runc children on this host) and a Slurm job that is not the Pod's placeholder (children of a
slurmstepd for that Slurm node) never run at once.

Nothing here asks slurmgate, Slurm or Kubernetes what they believe: the sampler reads /proc
(bench/chaos/observe.py's reader of job processes, and the Pod's own marker in its command
line), so a bug in what any of them report cannot hide an overlap.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from bench.chaos.reads import job_processes, processes

EVERY = 0.05  # s between two reads of /proc (one read takes a few ms)


def marked_pids(marker: str) -> list[int]:
    """Processes whose command line carries `marker` (the Pod's container puts it there)."""
    return [p.pid for p in processes() if marker in p.cmdline]


@dataclass
class Sample:
    t: float
    pod: tuple[int, ...]  # the Pod's processes
    jobs: tuple[int, ...]  # ids of the Slurm jobs (not placeholders) running on the node


@dataclass
class OverlapSampler:
    """Reads /proc every EVERY seconds until stopped; `overlaps` are the reads that saw the
    Pod's processes and another Slurm job's on `slurm_node` at once."""

    slurm_conf: str
    slurm_node: str
    marker: str
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> OverlapSampler:
        self._thread = threading.Thread(target=self._run, name="overlap-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            jobs = tuple(sorted({p.job_id for p in job_processes(self.slurm_conf)
                                 if p.node == self.slurm_node and not p.placeholder}))
            self.samples.append(Sample(time.time(), tuple(marked_pids(self.marker)), jobs))
            self._stop.wait(EVERY)

    def saw_pod(self) -> bool:
        return any(s.pod for s in self.samples)

    def saw_job(self, job_id: int) -> bool:
        return any(job_id in s.jobs for s in self.samples)

    @property
    def overlaps(self) -> list[Sample]:
        return [s for s in self.samples if s.pod and s.jobs]

    def gap(self) -> float | None:
        """Seconds from the last read that saw the Pod to the first that saw a job after it
        (None: not both seen)."""
        last_pod = max((s.t for s in self.samples if s.pod), default=None)
        if last_pod is None:
            return None
        first_job = min((s.t for s in self.samples if s.jobs and s.t > last_pod), default=None)
        return None if first_job is None else first_job - last_pod

    def report(self) -> str:
        o = self.overlaps
        head = (f"{len(self.samples)} reads of /proc, {len(o)} saw the Pod and a Slurm job on "
                f"{self.slurm_node} at once")
        return head + (f" (first at {o[0].t:.2f}: Pod pids {o[0].pod}, jobs {o[0].jobs})"
                       if o else f"; gap {self.gap()}")
