"""OCI image archives without Docker, buildah or a registry, and the real Nodes' pause image.

The sandbox ("pause") image cannot be pulled on the machines this runs on, so it is built
here: cluster/pause/main.go compiled static, put alone in one layer, and written as an OCI
image layout (blobs, manifest, index.json) in a tar that `ctr images import` takes. Layers and
archives are byte-for-byte reproducible (fixed mtimes, no gzip timestamp), so a rebuild gives
the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAUSE_SRC = HERE / "pause"
PAUSE_VERSION = "1.0"
# fully qualified: a short name is imported under a name the CRI does not find
PAUSE_IMAGE = f"localhost/slurmgate/pause:{PAUSE_VERSION}"

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


def cache_root() -> Path:
    """~/.cache/slurmgate, as build-binaries.sh has it."""
    if "SLURMGATE_CACHE" in os.environ:
        return Path(os.environ["SLURMGATE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "slurmgate"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, tuple[bytes, int]]) -> tuple[bytes, bytes]:
    """(uncompressed tar, gzipped tar) holding `files` (path in the image -> (data, mode))."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue(), gzip.compress(raw.getvalue(), mtime=0)


def write_archive(out: Path, name: str, files: dict[str, tuple[bytes, int]],
                  entrypoint: list[str], arch: str = "amd64") -> None:
    """An OCI image archive at `out`: one layer of `files`, tagged `name` (fully qualified)."""
    tar_bytes, gz = _layer(files)
    config = json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": entrypoint, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(tar_bytes)]},
        "history": [{"created_by": "slurmgate cluster/oci.py"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": _digest(gz), "size": len(gz)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": MANIFEST_TYPE, "digest": _digest(manifest), "size": len(manifest),
            "platform": {"architecture": arch, "os": "linux"},
            # containerd's import reads the first; other OCI tools the second
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name},
        }],
    }, sort_keys=True).encode()
    entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    for blob in (gz, config, manifest):
        entries[f"blobs/sha256/{_digest(blob).split(':', 1)[1]}"] = blob
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)


def pause_archive() -> Path:
    """The pause image's OCI archive, built on first use and cached, keyed by its source."""
    h = hashlib.sha256()
    for f in sorted(PAUSE_SRC.iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    out = cache_root() / "images" / f"pause-{PAUSE_VERSION}-{h.hexdigest()[:12]}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    binary = out.with_suffix(".bin")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), "."],
                   cwd=PAUSE_SRC, env=env, check=True)
    try:
        write_archive(out, PAUSE_IMAGE, {"/pause": (binary.read_bytes(), 0o755)}, ["/pause"])
    finally:
        binary.unlink(missing_ok=True)
    return out
