#!/usr/bin/env bash
# The e2e suite (fault variants included, kube_side tests left out: their subject does not change
# with the release) on several Slurm releases AT ONCE, each on its own local cluster (run dir
# /tmp/slurmgate-matrix-V, ports shifted by SLURMGATE_PORT_OFFSET), so that the matrix costs
# CI about one release's wall time, not the sum: the suites mostly wait on Slurm and the API
# server, and the two runs measured side by side on the 2-core CI machine (see the Makefile).
#
# The releases start one after the other: each suite is launched once the previous one's cluster
# is up (its env.json written), since a cold start creates Unix users and may move uids
# (cluster/unix_users.py), which two starts must not do at the same time. Each suite's output
# goes to its own log, printed whole (in release order) when all have ended; the exit status is
# the first failure's.
#
# A release written VERSION@K8S (e.g. 22.05@1.30.14) runs on that Kubernetes release's control
# plane (K8S_VERSION; built once, cached like the default one) instead of the pinned one, and
# then runs the kube_side tests marked kube_api too: their subject does not change with Slurm,
# but may with Kubernetes (the manifests' APIs, RBAC, TLS, admission).
#
# usage: tests/matrix.sh PYTHON VERSION[@K8S]... [-- PYTEST_ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."

python=$1
shift
versions=()
while (($#)) && [[ $1 != -- ]]; do
  versions+=("$1")
  shift
done
(($#)) && shift  # the --
extra=("$@")

logs=$(mktemp -d /tmp/slurmgate-matrix-logs.XXXXXX)
declare -A pid=()

env_of() {  # the environment of release number $1 (1-based) $2 (VERSION[@K8S])
  local v=${2%@*}
  echo "SLURM_VERSION=$v SLURMGATE_RUN_DIR=/tmp/slurmgate-matrix-$v SLURMGATE_PORT_OFFSET=$((1000 * $1))"
  [[ $2 == *@* ]] && echo "K8S_VERSION=${2#*@}"
}

select_of() {  # the tests of release $1: kube_api too on a Kubernetes release of its own
  if [[ $1 == *@* ]]; then
    echo "not incluster and (not kube_side or kube_api)"
  else
    echo "not incluster and not kube_side"
  fi
}

rc=0
i=0
for v in "${versions[@]}"; do
  i=$((i + 1))
  run_dir=/tmp/slurmgate-matrix-${v%@*}
  rm -rf "$run_dir"
  # shellcheck disable=SC2046
  env $(env_of "$i" "$v") "$python" -m pytest -q -p no:cacheprovider \
    -m "$(select_of "$v")" --durations=15 tests/e2e "${extra[@]}" \
    >"$logs/$v.log" 2>&1 &
  pid[$v]=$!
  # the next release starts once this one's cluster is up (or its suite ended): at most 10 min
  for _ in $(seq 600); do
    [[ -e $run_dir/env.json ]] && break
    kill -0 "${pid[$v]}" 2>/dev/null || break
    sleep 1
  done
done
for v in "${versions[@]}"; do
  wait "${pid[$v]}"
  r=$?
  on=""
  [[ $v == *@* ]] && on=" on Kubernetes ${v#*@}"
  echo "=== e2e on Slurm ${v%@*}$on (exit $r)"
  cat "$logs/$v.log"
  ((r == 0 || rc != 0)) || rc=$r
done
rm -rf "$logs"
exit "$rc"
