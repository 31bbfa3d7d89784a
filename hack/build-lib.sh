#!/bin/bash
# build-lib.sh is what the cache's build scripts share (build-tools.sh, build-kubelet.sh,
# build-conformance-tools.sh); they source it. Binaries go to
#
#   ${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}/NAME-VERSION
#
# named by the version their tool module (hack/tools/*/go.mod) requires, so bumping one there
# builds a new binary next to the old one instead of reusing it.

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}
mkdir -p "$bin_dir"
# The name build messages are prefixed with: the script that sourced this file.
build_script=$(basename "$0")

# module_version DIR MODULE prints the version of MODULE that DIR's module requires.
module_version() {
	(cd "$1" && go list -m -f '{{.Version}}' "$2")
}

# kube_ldflags VERSION prints the linker flags of a Kubernetes binary at VERSION: stripped, and
# the version stamped as the upstream release build does. Without it a binary calls itself
# v0.0.0-master, and e2e.test compares its own version with the apiserver's.
kube_ldflags() {
	local version=$1 major minor
	minor=${version#v*.}
	minor=${minor%%.*}
	major=${version#v}
	major=${major%%.*}
	local pkg=k8s.io/component-base/version
	echo "-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor" \
		"-X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
}

# cached_build NAME VERSION DIR CMD... PKG runs "CMD... -o OUT PKG" (a go build or a go test -c)
# in DIR to make BIN/NAME-VERSION, unless it is there already. Static (no cgo), at low priority
# so the machine stays usable, and written under a temporary name first so an interrupted
# build is never taken as cached. One build at a time on the machine, also across concurrent
# `make` runs: few cores, and two builds of one binary would only race for the same file. The
# lock is taken only when something is to be built, so a cached binary never waits.
cached_build() {
	local name=$1 version=$2 dir=$3
	shift 3
	local out="$bin_dir/$name-$version"
	if [[ -x "$out" ]]; then
		return 0
	fi
	exec 9>"$bin_dir/.build.lock"
	flock 9
	if [[ -x "$out" ]]; then # built by whoever held the lock
		return 0
	fi
	echo "$build_script: building $name $version into $out" >&2
	local start=$SECONDS
	local pkg=${*: -1}
	(cd "$dir" && CGO_ENABLED=0 nice -n 10 "${@:1:$#-1}" -o "$out.tmp" "$pkg")
	mv -f "$out.tmp" "$out"
	echo "$build_script: built $name $version in $((SECONDS - start))s" >&2
}
