"""What slurmgate asks of slurmrestd, counted by endpoint: a busy site's admin asks this first
(requests and bytes a second, and which calls), and the busy-site bench reads it."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram

_VERSIONED = re.compile(r"^/slurm(db)?/v\d+\.\d+\.\d+/")
_ID = re.compile(r"/\d+(?=/|$)")
_NODE = re.compile(r"^node/[^/]+$")
# fine below 50 ms, where a single request's answer lies on any site (the busy-site bench
# compares these with the same request timed directly), up to a whole list's minutes
LAT_BUCKETS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025,
               0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0, 600.0)


def endpoint(path: str) -> str:
    """A path as a bounded label: the version and every id or node name replaced
    (/slurm/v0.0.42/job/17 -> job/{id}, /slurm/v0.0.42/node/n1 -> node/{name};
    /slurmdb/v0.0.42/jobs/ -> slurmdb/jobs)."""
    p = _VERSIONED.sub(lambda m: "slurmdb/" if m.group(1) else "",
                       path.split("?", 1)[0]).strip("/")
    p = _ID.sub("/{id}", "/" + p).lstrip("/")
    return "node/{name}" if _NODE.match(p) else p or "/"


class RestMetrics:
    def __init__(self, component: str, registry: CollectorRegistry) -> None:
        p = f"slurmgate_{component}_slurmrestd"
        self.requests = Counter(f"{p}_requests_total", "Requests to slurmrestd, by method, "
                                "endpoint (ids replaced) and HTTP status ('error': no answer)",
                                ["method", "endpoint", "status"], registry=registry)
        self.bytes = Counter(f"{p}_response_bytes_total", "Bytes slurmrestd answered, by "
                             "endpoint", ["endpoint"], registry=registry)
        self.seconds = Histogram(f"{p}_request_seconds", "Time to slurmrestd's whole answer, "
                                 "by method and endpoint", ["method", "endpoint"],
                                 buckets=LAT_BUCKETS, registry=registry)

    def observe(self, method: str, path: str, status: int | None, nbytes: int,
                seconds: float) -> None:
        ep = endpoint(path)
        self.requests.labels(method, ep, str(status) if status else "error").inc()
        self.bytes.labels(ep).inc(nbytes)
        self.seconds.labels(method, ep).observe(seconds)
