#!/usr/bin/env bash
# Build the slurmgate image from the root Containerfile without Docker or a registry: buildah
# (chroot isolation, vfs storage of its own) on a Python base debootstrapped here. Everything
# lives in a cache outside the checkout, ${SLURMGATE_CACHE:-~/.cache/slurmgate}/images:
#   base/debian-<suite>-python<py>.tar   the trimmed Debian root (built once, ~45 s)
#   storage/, runroot/                   buildah's store: the base as
#                                        localhost/slurmgate/python-base:<py>-<suite>, the app image
#   <name>-<tag>-<hash>.oci.tar          the app image as an OCI archive; <hash> covers the
#                                        Containerfile, pyproject.toml, the package sources, this
#                                        script and the base, so unchanged sources reuse it
# The app image is checked before export (its three entry points answer --help, it runs as
# 65532, no compiler on PATH). Prints the archive's path on stdout; logs go to stderr.
#
#   bash cluster/build-image.sh [NAME [TAG]]   (default localhost/slurmgate/slurmgate:<version>)
#   SLURMGATE_IMAGE_REBUILD=1 ...              build even if the archive for these sources exists
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
log() { echo "[image] $*" >&2; }

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)
name=${1:-localhost/slurmgate/slurmgate}
tag=${2:-${version:-dev}}
ref="$name:$tag"
suite=${SLURMGATE_IMAGE_SUITE:-bookworm}
case $suite in
  bookworm) py=3.11 ;;
  trixie) py=3.13 ;;
  *) echo "SLURMGATE_IMAGE_SUITE: bookworm or trixie, not $suite" >&2; exit 2 ;;
esac
base_ref="localhost/slurmgate/python-base:$py-$suite"

cache_root=${SLURMGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slurmgate}
images="$cache_root/images"
mkdir -p "$images/base"
# One build at a time per cache (they share the store and the base).
exec 9>"$images/.lock"
flock 9

missing=()
for p in buildah debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

bah() { buildah --storage-driver vfs --root "$images/storage" --runroot "$images/runroot" "$@"; }
work=$(mktemp -d "$images/build.XXXXXX")
ctr=""
cleanup() {
  if [ -n "$ctr" ]; then bah rm "$ctr" >/dev/null 2>&1 || true; fi
  for m in proc sys dev/pts dev; do  # debootstrap's, if it was cut short
    mountpoint -q "$work/rootfs/$m" 2>/dev/null && umount -l "$work/rootfs/$m"
  done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# ---- the base: a trimmed Debian minbase root with python3 and venv, as a tarball, then an image
base_tar="$images/base/debian-$suite-python$py.tar"
if [ ! -f "$base_tar" ]; then
  mirror=${SLURMGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  root="$work/rootfs"
  log "debootstrap $suite (python3, python3-venv) into $root (about 45 s with a warm network)"
  debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  [ -x "$root/usr/bin/python$py" ] || { log "no python$py in the $suite root"; exit 1; }
  # Trim what a runtime never reads: package lists and archives, docs (the copyright notices
  # stay), man and info pages, translations (only the C locale is used), logs, host files.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
         "$root"/var/lib/dpkg/*-old "$root"/usr/share/man/* "$root"/usr/share/info/* \
         "$root"/usr/share/lintian "$root"/tmp/* "$root"/var/tmp/*
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  find "$root/var/log" -type f -delete
  : > "$root/etc/resolv.conf"
  rm -f "$root/etc/hostname"
  # The Containerfile runs `python -m venv` (python:*-slim has `python`; Debian only python3).
  ln -s /usr/bin/python3 "$root/usr/local/bin/python"
  # A tar keeps owners and modes (`buildah copy` of a directory would make everything root:root).
  tar --numeric-owner --xattrs -C "$root" -cf "$base_tar.tmp" .
  rm -rf --one-file-system "$root"
  mv "$base_tar.tmp" "$base_tar"
  bah rmi -f "$base_ref" >/dev/null 2>&1 || true  # an image from an older tarball
fi
if ! bah inspect --type image "$base_ref" >/dev/null 2>&1; then
  log "importing $base_tar as $base_ref"
  ctr=$(bah from scratch)
  bah add "$ctr" "$base_tar" / >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 --workingdir / \
    --label "org.opencontainers.image.description=Debian $suite minbase, python$py + venv" \
    "$ctr"
  bah commit --quiet --rm "$ctr" "$base_ref" >/dev/null
  ctr=""
fi
base_id=$(bah inspect --type image --format '{{.FromImageID}}' "$base_ref")

# ---- the app image, keyed by what goes into it
inputs() {
  cd "$repo"
  echo "$ref $base_id"
  sha256sum Containerfile .dockerignore pyproject.toml cluster/build-image.sh
  local src=(slurmgate webhook binder certs pinning)
  local skip=(\( -name __pycache__ -o -name '*.egg-info' \) -prune)
  find "${src[@]}" "${skip[@]}" -o -type l -printf '%p -> %l\n' | sort
  find "${src[@]}" "${skip[@]}" -o -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
}
key=$(inputs | sha256sum | cut -c1-12)
archive="$images/${name//\//_}-$tag-$key.oci.tar"
if [ -f "$archive" ] && [ -z "${SLURMGATE_IMAGE_REBUILD:-}" ]; then
  log "$ref unchanged: $archive"
  echo "$archive"
  exit 0
fi

# pip inside the build sees the host's index settings and trust store (an intercepting proxy's
# CA, a mirror): a pip.conf and the CA bundle bind-mounted for the RUN steps only, so neither
# lands in an image layer. HTTP(S)_PROXY pass through by buildah's default (--http-proxy).
python3 - "$work/pip.conf" <<'PY'
import configparser, os, sys
keys = ("index-url", "extra-index-url", "trusted-host", "timeout", "retries")
cfg = configparser.RawConfigParser()
home = os.path.expanduser("~")
cfg.read(["/etc/xdg/pip/pip.conf", "/etc/pip.conf", f"{home}/.pip/pip.conf",
          f"{home}/.config/pip/pip.conf", os.environ.get("PIP_CONFIG_FILE", "")])
out = {k: cfg.get(s, k) for s in ("global", "install") if cfg.has_section(s)
       for k in keys if cfg.has_option(s, k)}
env = {"PIP_DEFAULT_TIMEOUT": "timeout", **{"PIP_" + k.upper().replace("-", "_"): k for k in keys}}
out.update({k: os.environ[e] for e, k in env.items() if os.environ.get(e)})
out["cert"] = "/etc/pip-build-ca.crt"
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in out.items()))
PY
ca=${PIP_CERT:-$(sed -n 's/^cert *= *//p' /etc/pip.conf 2>/dev/null | head -1)}
[ -f "${ca:-}" ] || ca=/etc/ssl/certs/ca-certificates.crt
mounts=(-v "$work/pip.conf:/etc/pip.conf:ro")
if [ -f "$ca" ]; then mounts+=(-v "$ca:/etc/pip-build-ca.crt:ro"); else sed -i '/^cert/d' "$work/pip.conf"; fi

log "building $ref on $base_ref"
start=$SECONDS
bah bud --isolation chroot --pull=never --layers=false "${mounts[@]}" \
  --build-arg "BASE=$base_ref" -t "$ref" -f "$repo/Containerfile" "$repo" >&2
log "built in $((SECONDS - start)) s"

# ---- check the image itself (the runtime stage, not the builder): entry points, user, no compiler
ctr=$(bah from --pull=never --quiet "$ref")
for cmd in slurmgate-webhook slurmgate-binder slurmgate-certs; do
  bah run --isolation chroot "$ctr" -- "$cmd" --help >/dev/null
done
uid=$(bah run --isolation chroot "$ctr" -- id -u)
[ "$uid" = 65532 ] || { log "the image runs as uid $uid, not 65532"; exit 1; }
# shellcheck disable=SC2016  # $c expands in the image's sh
bah run --isolation chroot "$ctr" -- sh -c \
  'for c in gcc cc c++ g++ clang ld as make; do command -v $c && exit 1; done; exit 0' >&2 \
  || { log "a compiler or build tool is on the image's PATH"; exit 1; }
bah rm "$ctr" >/dev/null
ctr=""

bah push --quiet "$ref" "oci-archive:$archive.tmp:$ref" >&2
mv "$archive.tmp" "$archive"
# Older archives of this name and tag, and the images the tag moved away from, go.
for old in "$images/${name//\//_}-$tag-"*.oci.tar; do
  [ "$old" = "$archive" ] || rm -f "$old"
done
bah rmi --prune >/dev/null 2>&1 || true
log "$ref: $(bah images --noheading --format '{{.Size}}' "$ref") uncompressed," \
    "archive $(du -h "$archive" | cut -f1)"
echo "$archive"
