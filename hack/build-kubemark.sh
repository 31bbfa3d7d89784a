#!/bin/bash
# build-kubemark.sh builds upstream's hollow node, kubemark, that `make fleet` runs beside
# hollow holdfast nodes, from the module in hack/tools/kubemark, into the same cache as
# hack/build-tools.sh (hack/build-lib.sh):
#
#   BIN/kubemark-vX.Y.Z
#
# Opt-in: `make test` never runs it (the fleet's smoke test measures holdfast alone when the
# binary is absent). It shares most packages with the kubelet (hack/build-kubelet.sh): a few
# minutes on 2 cores once that build has filled Go's build cache. Static, with the version
# stamped as the release build does, so the hollow Nodes report kubeletVersion vX.Y.Z. Prints
# the binary's path.
set -euo pipefail
source "$(dirname "$0")/build-lib.sh"

dir="$repo/hack/tools/kubemark"
version=$(module_version "$dir" k8s.io/kubernetes)
cached_build kubemark "$version" "$dir" go build -trimpath -ldflags "$(kube_ldflags "$version")" .
echo "$bin_dir/kubemark-$version"
