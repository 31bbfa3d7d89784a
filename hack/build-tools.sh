#!/bin/bash
# build-tools.sh builds the control plane binaries the integration tests run, kube-apiserver,
# kube-controller-manager, kube-scheduler and etcd, from the modules in hack/tools, into a cache
# outside the repository:
#
#   ${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}/kube-apiserver-vX.Y.Z
#   ${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}/etcd-vX.Y.Z
#   (likewise kube-controller-manager-vX.Y.Z and kube-scheduler-vX.Y.Z)
#   ${HOLDFAST_TEST_BIN:-...}/registry-vX.Y.Z   (the distribution registry, for pull tests)
#
# The versions come from hack/tools/*/go.mod, so bumping one there builds a new binary next to
# the old one instead of reusing it. A binary already in the cache is not rebuilt: the first
# kube-apiserver build takes 10-15 minutes on 2 cores, later runs take no time. Quiet when
# there is nothing to build.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}
mkdir -p "$bin_dir"

# One build at a time, also across concurrent `make test` runs: the machine has few cores and
# two builds of the same binary would only race for the same file.
exec 9>"$bin_dir/.build.lock"
flock 9

# module_version DIR MODULE prints the version of MODULE that DIR's module requires.
module_version() {
	(cd "$1" && go list -m -f '{{.Version}}' "$2")
}

# build NAME VERSION DIR [go build flags...] builds DIR into $bin_dir/NAME-VERSION unless it
# is there already. Static (no cgo), -trimpath, and written under a temporary name first so an
# interrupted build never leaves a truncated binary that would be taken as cached.
build() {
	local name=$1 version=$2 dir=$3
	shift 3
	local out="$bin_dir/$name-$version"
	if [[ -x "$out" ]]; then
		return 0
	fi
	echo "build-tools.sh: building $name $version into $out" >&2
	local start=$SECONDS
	(cd "$dir" && CGO_ENABLED=0 go build -trimpath "$@" -o "$out.tmp" .)
	mv -f "$out.tmp" "$out"
	echo "build-tools.sh: built $name $version in $((SECONDS - start))s" >&2
}

# etcd first: it takes a minute, kube-apiserver ten.
etcd_dir="$repo/hack/tools/etcd"
etcd_version=$(module_version "$etcd_dir" go.etcd.io/etcd/server/v3)
build etcd "$etcd_version" "$etcd_dir" -ldflags "-s -w"

# The OCI registry the image pull tests pull from (about a minute).
registry_dir="$repo/hack/tools/registry"
registry_version=$(module_version "$registry_dir" github.com/distribution/distribution/v3)
build registry "$registry_version" "$registry_dir" -ldflags "-s -w"

kube_dir="$repo/hack/tools/kube-apiserver"
kube_version=$(module_version "$kube_dir" k8s.io/kubernetes)
kube_minor=${kube_version#v*.}
kube_minor=${kube_minor%%.*}
kube_major=${kube_version#v}
kube_major=${kube_major%%.*}
# The version the apiserver reports on /version, as the upstream release build sets it;
# without it the binary calls itself v0.0.0-master.
version_pkg=k8s.io/component-base/version
kube_ldflags="-s -w \
	-X $version_pkg.gitVersion=$kube_version \
	-X $version_pkg.gitMajor=$kube_major \
	-X $version_pkg.gitMinor=$kube_minor \
	-X $version_pkg.gitTreeState=clean \
	-X $version_pkg.buildDate=1970-01-01T00:00:00Z"
build kube-apiserver "$kube_version" "$kube_dir" -ldflags "$kube_ldflags"

# The cluster's controllers and scheduler, for the tests that need a real cluster around the
# node: TLS bootstrap (CSR approval and signing) and the conformance suite. They share most of
# their packages with kube-apiserver, so they build in a few minutes once it is built.
for tool in kube-controller-manager kube-scheduler; do
	tool_dir="$repo/hack/tools/$tool"
	build "$tool" "$(module_version "$tool_dir" k8s.io/kubernetes)" "$tool_dir" -ldflags "$kube_ldflags"
done
