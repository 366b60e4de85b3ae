"""Concurrent Pod patches on new connections vs open ones: why the binder keeps its pool warm.

    python -m bench.warm_pool [--kubeconfig F] [--pods 20] [--rounds 3]

On any cluster (the bench's, `make demo`'s): creates a namespace of unschedulable Pods (a
nodeName no Node has), then per round, with a fresh client, patches every Pod at once on a cold
pool and twice more on the pool that round opened. Prints p50 / max per pass and the ratio;
deletes the namespace at the end. The patch is the binder's gate patch's shape: a JSON patch.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid

from slurmgate.kube import KubeClient, KubeError, load_config, pod_path


async def _patch_all(kube: KubeClient, ns: str, names: list[str]) -> list[float]:
    async def one(name: str) -> float:
        t0 = time.perf_counter()
        await kube.json_patch(pod_path(ns, name), [
            {"op": "add", "path": "/metadata/annotations", "value": {"bench": str(t0)}}])
        return (time.perf_counter() - t0) * 1000

    return sorted(await asyncio.gather(*(one(n) for n in names)))


async def run(kubeconfig: str | None, pods: int, rounds: int) -> int:
    cfg = load_config(kubeconfig)
    ns = f"bench-warm-{uuid.uuid4().hex[:6]}"
    names = [f"p{i}" for i in range(pods)]
    async with KubeClient(cfg) as kube:
        await kube.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        try:
            await asyncio.gather(*(kube.create(pod_path(ns), {
                "metadata": {"name": n},
                "spec": {"nodeName": "bench-warm-nowhere",
                         "containers": [{"name": "c", "image": "none"}]}}) for n in names))
            cold: list[float] = []
            warm: list[float] = []
            for r in range(rounds):
                async with KubeClient(cfg) as fresh:
                    for label, out in (("cold", cold), ("warm", warm), ("warm", warm)):
                        t = await _patch_all(fresh, ns, names)
                        out.append(statistics.median(t))
                        print(f"round {r + 1} {label}: {pods} concurrent patches, "
                              f"p50 {statistics.median(t):.1f} ms, max {t[-1]:.1f} ms")
            c, w = statistics.median(cold), statistics.median(warm)
            print(f"median of p50s: new connections {c:.1f} ms, open ones {w:.1f} ms "
                  f"({c / w:.2f}x)")
        finally:
            try:
                await kube.delete(f"/api/v1/namespaces/{ns}")
            except KubeError as e:
                print(f"could not delete namespace {ns}: {e}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.warm_pool")
    ap.add_argument("--kubeconfig", default=None)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    return asyncio.run(run(a.kubeconfig, a.pods, a.rounds))


if __name__ == "__main__":
    sys.exit(main())
