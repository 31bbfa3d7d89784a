#!/bin/bash
# build-conformance-tools.sh builds what `make conformance` runs besides the control plane and
# the registry (hack/build-tools.sh) and the upstream kubelet (hack/build-kubelet.sh), into the
# same cache (hack/build-lib.sh):
#
#   BIN/e2e.test-vX.Y.Z   Kubernetes' end-to-end suite (go test -c k8s.io/kubernetes/test/e2e)
#   BIN/ginkgo-vX.Y.Z     the ginkgo CLI at the version the suite uses, which runs it in parallel
#   BIN/agnhost-vX.Y.Z    the suite's test image binary, static, from the same module
#   BIN/nnp-vX.Y.Z        the nonewprivs image's binary, from the same module
#
# The versions come from hack/tools/e2e/go.mod (named by the Kubernetes version); a binary
# already in the cache is not rebuilt. e2e.test is built without go test's vet step, which
# alone took most of an hour over the e2e tree on two cores; agnhost takes 20 s, nnp under a
# minute.
set -euo pipefail
source "$(dirname "$0")/build-lib.sh"

e2e_dir="$repo/hack/tools/e2e"
kube_version=$(module_version "$e2e_dir" k8s.io/kubernetes)

cached_build agnhost "$kube_version" "$e2e_dir" go build -trimpath -ldflags "-s -w" k8s.io/kubernetes/test/images/agnhost
cached_build nnp "$kube_version" "$e2e_dir" go build -trimpath -ldflags "-s -w" k8s.io/kubernetes/test/images/nonewprivs
cached_build ginkgo "$kube_version" "$e2e_dir" go build -trimpath -ldflags "-s -w" github.com/onsi/ginkgo/v2/ginkgo
cached_build e2e.test "$kube_version" "$e2e_dir" go test -c -vet=off -trimpath -ldflags "$(kube_ldflags "$kube_version")" k8s.io/kubernetes/test/e2e
