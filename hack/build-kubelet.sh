#!/bin/bash
# build-kubelet.sh builds the upstream kubelet that `make bench` runs side by side with
# holdfast, from the module in hack/tools/kubelet, into the same cache as hack/build-tools.sh:
#
#   ${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}/kubelet-vX.Y.Z
#
# Opt-in: `make test` never runs it (the harness's smoke test measures holdfast alone when the
# binary is absent). The version comes from hack/tools/kubelet/go.mod; a binary already in the
# cache is not rebuilt. The first build takes a few minutes on 2 cores once kube-apiserver's
# build has filled Go's build cache (the two share most packages), more from a cold cache.
# Builds at low priority (nice) so the machine stays usable. Prints the binary's path.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=${HOLDFAST_TEST_BIN:-${HOLDFAST_CACHE:-/var/cache/holdfast}/bin}
mkdir -p "$bin_dir"

dir="$repo/hack/tools/kubelet"
version=$(cd "$dir" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
out="$bin_dir/kubelet-$version"
if [[ -x "$out" ]]; then
	echo "$out"
	exit 0
fi

# The same lock as hack/build-tools.sh: one build at a time on this machine.
exec 9>"$bin_dir/.build.lock"
flock 9
if [[ -x "$out" ]]; then # built by whoever held the lock
	echo "$out"
	exit 0
fi

minor=${version#v*.}
minor=${minor%%.*}
major=${version#v}
major=${major%%.*}
version_pkg=k8s.io/component-base/version
echo "build-kubelet.sh: building kubelet $version into $out" >&2
start=$SECONDS
# Static, like the upstream release's kubelet; version stamped as the release build does,
# so the Node reports kubeletVersion vX.Y.Z rather than v0.0.0-master.
(cd "$dir" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w \
	-X $version_pkg.gitVersion=$version \
	-X $version_pkg.gitMajor=$major \
	-X $version_pkg.gitMinor=$minor \
	-X $version_pkg.gitTreeState=clean \
	-X $version_pkg.buildDate=1970-01-01T00:00:00Z" -o "$out.tmp" .)
mv -f "$out.tmp" "$out"
echo "build-kubelet.sh: built kubelet $version in $((SECONDS - start))s" >&2
echo "$out"
