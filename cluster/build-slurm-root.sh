#!/usr/bin/env bash
# Build a Debian root holding a newer Slurm (24.11 from trixie, 26.05 from sid) for the local
# cluster, once, in a cache outside the checkout keyed by suite and Slurm package version.
# Their binaries need a newer glibc than the host's, so the daemons run chrooted in it and share
# the host's network. Idempotent: a complete root is reused. Prints the root's path on stdout.
#
#   bash cluster/build-slurm-root.sh 24.11|26.05
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
log() { echo "[slurm-root] $*" >&2; }

case "${1:-}" in
  24.11) suite=trixie; pin=$SLURM_24_11_DEBIAN ;;
  26.05) suite=sid; pin=$SLURM_26_05_DEBIAN ;;
  *) echo "usage: $0 24.11|26.05 (22.05 runs from the host's packages)" >&2; exit 2 ;;
esac
cache_root=${SLURMGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slurmgate}
roots="$cache_root/roots"
want="$roots/$suite-slurm-$pin"
mkdir -p "$roots"
# A root built before slurmdbd was part of it gets it added (same pinned version as slurmctld).
complete() {
  local r=$1
  [ -x "$r/usr/sbin/slurmdbd" ] && return 0
  log "adding slurmdbd to $r"
  local v
  v=$(chroot "$r" dpkg-query -W -f='${Version}' slurmctld)
  chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends slurmdbd=$v \
           && apt-get clean" >&2
}
# A complete root has this stamp; a build cut short leaves none and is redone.
if [ -f "$want/.slurmgate-root" ]; then complete "$want"; echo "$want"; exit 0; fi
# The pinned version vanished from the mirror once before: reuse what we fell back to then.
if [ -f "$want.fallback" ] && [ -f "$(cat "$want.fallback")/.slurmgate-root" ]; then
  complete "$(cat "$want.fallback")"; cat "$want.fallback"; exit 0
fi

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
mirror=${SLURMGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "$roots/build-$suite.XXXXXX")
cleanup() {
  for m in proc sys dev; do mountpoint -q "$work/$m" 2>/dev/null && umount -l "$work/$m"; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
chmod 755 "$work"

log "debootstrap $suite into $work (about 40 s with a warm network)"
debootstrap --variant=minbase "$suite" "$work" "$mirror" >"$work.log" 2>&1 || {
  tail -20 "$work.log" >&2; rm -f "$work.log"; exit 1; }
rm -f "$work.log"
cp /etc/resolv.conf /etc/hosts "$work/etc/"
# No service starts inside the root when packages install; we start every daemon ourselves.
printf '#!/bin/sh\nexit 101\n' > "$work/usr/sbin/policy-rc.d"
chmod +x "$work/usr/sbin/policy-rc.d"
# sid's Release file can read as expired on a mirror snapshot.
echo 'Acquire::Check-Valid-Until "false";' > "$work/etc/apt/apt.conf.d/99novalid"
inroot() { chroot "$work" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }
inroot apt-get update -qq >&2
pkgs=(munge slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin slurmdbd)
pinned=()
for p in "${pkgs[@]}"; do
  case $p in munge) pinned+=("$p") ;; *) pinned+=("$p=$pin") ;; esac
done
if ! inroot apt-get install -y -qq --no-install-recommends "${pinned[@]}" >&2; then
  have=$(inroot apt-cache policy slurmctld | awk '/Candidate:/ {print $2}')
  log "WARNING: slurmctld=$pin is no longer on the $suite mirror; falling back to the suite's" \
      "current $have. Update SLURM_${1/./_}_DEBIAN in cluster/versions.env to pin it."
  inroot apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
fi
got=$(inroot dpkg-query -W -f='${Version}' slurmctld)
inroot useradd -r -M -s /usr/sbin/nologin slurmrest
inroot apt-get clean
final="$roots/$suite-slurm-$got"
touch "$work/.slurmgate-root"
rm -rf --one-file-system "$final"
mv "$work" "$final"
trap - EXIT
[ "$final" = "$want" ] || echo "$final" > "$want.fallback"
log "Slurm $got ready in $final"
echo "$final"
