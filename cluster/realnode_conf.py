"""The files one real Node runs on (cluster/realnode.py): containerd's config, the CNI conflist,
the KubeletConfiguration, the kubelet's kubeconfig and certificates. Text only, no processes.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from slurmgate import contract
from slurmgate.certs import pki

CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins


def containerd_toml(d: Path, socket: Path, sandbox_image: str, cni_conf_dir: Path,
                    runc: Path | None = None) -> str:
    """`runc`: slurmgate-runc's launcher for this Node (runc_launcher), run in runc's place,
    with the Pods' slurmgate.io/* annotations in each container's spec; None: runc itself."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    pinning = (f'  pod_annotations = ["{contract.DOMAIN}/*"]\n' if runc else "")
    binary = f'  BinaryName = "{runc}"\n' if runc else ""
    return f"""version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'opt'}"

[{cri}]
  sandbox_image = "{sandbox_image}"
  # no AppArmor on these machines
  disable_apparmor = true
  # REQUIRED here: without CAP_SYS_RESOURCE every sandbox fails with
  # "can't get final child's PID from pipe: EOF"
  restrict_oom_score_adj = true
  # the Pods' network namespaces under our state dir, not the shared /var/run/netns
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{pinning}
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  # runc's state under ours too, not in the shared /run/containerd/runc
  Root = "{d / 'runc'}"
{binary}
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1
"""


def runc_launcher(python: str, runc: str, slurm_nodes: list[str],
                  gpu_devices: list[str] | None = None) -> str:
    """The executable containerd runs as runc (BinaryName takes no arguments): `create` goes
    through slurmgate-runc (python -m slurmgate.pinning), every other call straight to runc,
    so a container's state, kill and delete calls pay no Python start. `gpu_devices`: the
    Node's GPU device files in gres index order."""
    nodes = shlex.quote(",".join(slurm_nodes))
    gpus = shlex.quote(",".join(gpu_devices or []))
    python, runc = shlex.quote(python), shlex.quote(runc)
    return f"""#!/bin/sh
# slurmgate-runc for this Node: containers of marked Pods start on their Slurm job's cores
case " $* " in
  *" create "*)
    SLURMGATE_RUNC={runc} SLURMGATE_SLURM_NODES={nodes} SLURMGATE_GPU_DEVICES={gpus} \\
      exec {python} -m slurmgate.pinning "$@" ;;
esac
exec {runc} "$@"
"""


def cni_conflist(name: str, bridge: str, pod_cidr: str, ipam_dir: Path) -> str:
    return json.dumps({
        "cniVersion": "0.4.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge", "bridge": bridge,
                # the bridge holds the gateway: Pods reach the host's address (the apiserver)
                # through it, and the host reaches Pod IPs over its connected route
                "isGateway": True,
                # no masquerade, so no iptables rules left behind by a crashed node
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    # the default (/var/lib/cni/networks) is shared by every node on the host
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2)


def kubelet_config(*, address: str, port: int, healthz_port: int, cgroup_root: str,
                   runtime_socket: Path, pki_dir: Path, ca_file: str, pod_logs_dir: Path,
                   max_pods: int = 110) -> str:
    endpoint = f"unix://{runtime_socket}"
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 hybrid machines: the kubelet refuses them unless told
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # every node's Pods under a cgroup of its own, so two kubelets never fight over
        # /kubepods; the kubelet itself stays where it was started
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "address": address, "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "tlsCertFile": str(pki_dir / "kubelet.crt"),
        "tlsPrivateKeyFile": str(pki_dir / "kubelet.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": ca_file}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        # a dev machine's disk and memory are shared with everything else: never evict
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(pod_logs_dir),
        "maxPods": max_pods,
        "nodeStatusReportFrequency": "10s",
        "serializeImagePulls": False,
    }, indent=2)


def kubeconfig(server: str, ca_file: str, cert: Path, key: Path) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server,
                                                   "certificate-authority": ca_file}}],
        "users": [{"name": "kubelet", "user": {"client-certificate": str(cert),
                                               "client-key": str(key)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "kubelet"}}],
        "current-context": "local",
    }, indent=2)


def kubelet_certs(pki_dir: Path, kube_pki: Path, name: str, node_ip: str) -> None:
    """The kubelet's client cert (the Node authorizer knows it as system:node:NAME) and its
    serving cert (kube-apiserver checks it against the cluster CA at the node's InternalIP)."""
    ca_key, ca = pki.load_key(kube_pki / "ca.key"), pki.load_cert(kube_pki / "ca.crt")
    key, cert = pki.make_cert(ca_key, ca, f"system:node:{name}", organizations=["system:nodes"],
                              client=True, server=False, days=3650)
    pki.write_key(pki_dir / "client.key", key)
    pki.write_cert(pki_dir / "client.crt", cert)
    key, cert = pki.make_cert(ca_key, ca, name, dns_names=[name], ip_addresses=[node_ip],
                              days=3650)
    pki.write_key(pki_dir / "kubelet.key", key)
    pki.write_cert(pki_dir / "kubelet.crt", cert)
