#!/bin/bash
# build-tools.sh builds the control plane binaries the integration tests run, kube-apiserver,
# kube-controller-manager, kube-scheduler and etcd, the distribution registry the image pull
# tests pull from, the konnectivity server the tunnel test runs and OPA's CLI the Rego policy
# tests compile with and crictl, from the modules in hack/tools, into the cache outside the repository
# (hack/build-lib.sh says where and how):
#
#   BIN/kube-apiserver-vX.Y.Z, BIN/kube-controller-manager-vX.Y.Z, BIN/kube-scheduler-vX.Y.Z
#   BIN/etcd-vX.Y.Z
#   BIN/registry-vX.Y.Z
#   BIN/kubectl-vX.Y.Z
#   BIN/konnectivity-server-vX.Y.Z
#   BIN/opa-vX.Y.Z
#   BIN/crictl-vX.Y.Z
#
# A binary already in the cache is not rebuilt: the first kube-apiserver build takes 10-15
# minutes on 2 cores, later runs take no time. Quiet when there is nothing to build.
set -euo pipefail
source "$(dirname "$0")/build-lib.sh"

# etcd first: it takes a minute, kube-apiserver ten.
etcd_dir="$repo/hack/tools/etcd"
cached_build etcd "$(module_version "$etcd_dir" go.etcd.io/etcd/server/v3)" "$etcd_dir" \
	go build -trimpath -ldflags "-s -w" .

# The OCI registry the image pull tests pull from (about a minute).
registry_dir="$repo/hack/tools/registry"
cached_build registry "$(module_version "$registry_dir" github.com/distribution/distribution/v3)" "$registry_dir" \
	go build -trimpath -ldflags "-s -w" .

# kube-apiserver, then the cluster's controllers and scheduler, for the tests that need a real
# cluster around the node: TLS bootstrap (CSR approval and signing) and the conformance suite.
# They share most of their packages with kube-apiserver, so they build in a few minutes once it
# is built.
# kubectl, from the k8s.io/kubectl library as upstream's cmd/kubectl: the node API tests drive
# holdfast with it as an operator does. The library is at v0.X.Y for release v1.X.Y; the binary
# is stamped with the release so that kubectl does not warn about version skew.
kubectl_dir="$repo/hack/tools/kubectl"
kubectl_version=$(module_version "$kubectl_dir" k8s.io/kubectl)
kubectl_version="v1.${kubectl_version#v0.}"
cached_build kubectl "$kubectl_version" "$kubectl_dir" go build -trimpath -ldflags "$(kube_ldflags "$kubectl_version")" .

for tool in kube-apiserver kube-controller-manager kube-scheduler; do
	tool_dir="$repo/hack/tools/$tool"
	version=$(module_version "$tool_dir" k8s.io/kubernetes)
	cached_build "$tool" "$version" "$tool_dir" go build -trimpath -ldflags "$(kube_ldflags "$version")" .
done

# The konnectivity server (apiserver-network-proxy), for the test of the node API reached through
# the tunnel holdfast dials out (agent/tunnel); about a minute once kube-apiserver is built.
konnectivity_dir="$repo/hack/tools/konnectivity-server"
cached_build konnectivity-server "$(module_version "$konnectivity_dir" sigs.k8s.io/apiserver-network-proxy)" "$konnectivity_dir" \
	go build -trimpath -ldflags "-s -w" .

# Open Policy Agent's CLI: the Rego policy tests compile their policies with `opa build -t wasm`
# as a user does, and `make bench` runs `opa bench` beside holdfast's evaluation (a few minutes).
opa_dir="$repo/hack/tools/opa"
cached_build opa "$(module_version "$opa_dir" github.com/open-policy-agent/opa)" "$opa_dir" \
	go build -trimpath -ldflags "-s -w" .

# crictl, from sigs.k8s.io/cri-tools (the module's tool directive): the CRI backend's tests
# check that an operator's crictl sees and reaches holdfast's pods (about two minutes).
crictl_dir="$repo/hack/tools/crictl"
cached_build crictl "$(module_version "$crictl_dir" sigs.k8s.io/cri-tools)" "$crictl_dir" \
	go build -trimpath -ldflags "-s -w" sigs.k8s.io/cri-tools/cmd/crictl
