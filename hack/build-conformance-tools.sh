#!/bin/bash
# build-conformance-tools.sh builds what `make conformance` runs besides the control plane and
# the registry (hack/build-tools.sh) and the upstream kubelet (hack/build-kubelet.sh), into the
# same cache:
#
#   BIN/e2e.test-vX.Y.Z   Kubernetes' end-to-end suite (go test -c k8s.io/kubernetes/test/e2e)
#   BIN/ginkgo-vX.Y.Z     the ginkgo CLI at the version the suite uses, which runs it in parallel
#   BIN/agnhost-vX.Y.Z    the suite's test image binary, static, from the same module
#   BIN/nnp-vX.Y.Z        the nonewprivs image's binary, from the same module
#
# BIN is ${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}. The versions come
# from hack/tools/e2e/go.mod; a binary already in the cache is not rebuilt. Builds one at a time under the cache's .build.lock, at low priority (nice), each
# written under a temporary name first so an interrupted build is never taken as cached.
# Measured on 2 cores at load 40-60: e2e.test had not finished after 96 minutes (still in go
# test's vet step, before the link); agnhost took 20 s, nnp under a minute.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}
mkdir -p "$bin_dir"

exec 9>"$bin_dir/.build.lock"
flock 9

module_version() {
	(cd "$1" && go list -m -f '{{.Version}}' "$2")
}

# build NAME VERSION DIR CMD... PKG runs "CMD... -o OUT.tmp PKG" (a go build or go test -c) in
# DIR unless BIN/NAME-VERSION exists.
build() {
	local name=$1 version=$2 dir=$3
	shift 3
	local out="$bin_dir/$name-$version"
	if [[ -x "$out" ]]; then
		return 0
	fi
	echo "build-conformance-tools.sh: building $name $version into $out" >&2
	local start=$SECONDS
	local pkg=${*: -1}
	(cd "$dir" && CGO_ENABLED=0 nice -n 10 "${@:1:$#-1}" -o "$out.tmp" "$pkg")
	mv -f "$out.tmp" "$out"
	echo "build-conformance-tools.sh: built $name $version in $((SECONDS - start))s" >&2
}

e2e_dir="$repo/hack/tools/e2e"
kube_version=$(module_version "$e2e_dir" k8s.io/kubernetes)
kube_minor=${kube_version#v*.}
kube_minor=${kube_minor%%.*}
kube_major=${kube_version#v}
kube_major=${kube_major%%.*}
version_pkg=k8s.io/component-base/version
# Stamped as the release build does: the suite compares its own version with the apiserver's.
kube_ldflags="-s -w \
	-X $version_pkg.gitVersion=$kube_version \
	-X $version_pkg.gitMajor=$kube_major \
	-X $version_pkg.gitMinor=$kube_minor \
	-X $version_pkg.gitTreeState=clean \
	-X $version_pkg.buildDate=1970-01-01T00:00:00Z"

build agnhost "$kube_version" "$e2e_dir" go build -trimpath -ldflags "-s -w" k8s.io/kubernetes/test/images/agnhost
build nnp "$kube_version" "$e2e_dir" go build -trimpath -ldflags "-s -w" k8s.io/kubernetes/test/images/nonewprivs
build ginkgo "$kube_version" "$e2e_dir" go build -trimpath -ldflags "-s -w" github.com/onsi/ginkgo/v2/ginkgo
build e2e.test "$kube_version" "$e2e_dir" go test -c -vet=off -trimpath -ldflags "$kube_ldflags" k8s.io/kubernetes/test/e2e
