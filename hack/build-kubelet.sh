#!/bin/bash
# build-kubelet.sh builds the upstream kubelet that `make bench` and `make conformance` run side
# by side with holdfast, from the module in hack/tools/kubelet, into the same cache as
# hack/build-tools.sh (hack/build-lib.sh):
#
#   BIN/kubelet-vX.Y.Z
#
# Opt-in: `make test` never runs it (the harness's smoke test measures holdfast alone when the
# binary is absent). The first build takes a few minutes on 2 cores once kube-apiserver's build
# has filled Go's build cache (the two share most packages), more from a cold cache. Static,
# like the upstream release's kubelet, with the version stamped as the release build does, so
# the Node reports kubeletVersion vX.Y.Z rather than v0.0.0-master. Prints the binary's path.
set -euo pipefail
source "$(dirname "$0")/build-lib.sh"

dir="$repo/hack/tools/kubelet"
version=$(module_version "$dir" k8s.io/kubernetes)
cached_build kubelet "$version" "$dir" go build -trimpath -ldflags "$(kube_ldflags "$version")" .
echo "$bin_dir/kubelet-$version"
