#!/bin/sh
# payload-install.sh SRC installs holdfast on the test VM from the payload disk mounted at SRC
# (test/gateway/payload.go writes it) as a gateway is provisioned: the amd64 firmware bundle
# (`make firmware`) installed by the bundle's own install.sh, then what the site adds on top:
# the images its pods need (preloaded), its bootstrap kubeconfig and its configuration, and
# containerd's configuration where the site gives one.
# The guest's holdfast-payload.service runs it once per payload.
set -eu
src=$1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$src"/bundle/holdfast-*-linux-amd64.tar.gz -C "$work"
"$work"/holdfast-*-linux-amd64/install.sh

# The site: preloaded images, this gateway's join token and configuration.
for f in "$src"/images/*.tar; do
	if [ -e "$f" ]; then install -m 0644 "$f" /usr/lib/holdfast/images/; fi
done
if [ -e "$src/site/bootstrap-kubeconfig" ]; then
	install -m 0600 "$src/site/bootstrap-kubeconfig" /etc/holdfast/bootstrap-kubeconfig
fi
install -m 0644 "$src/site/config.yaml" /etc/holdfast/config.yaml
# A site that runs holdfast's CRI backend configures containerd's CRI plugin (its cgroup
# driver, its CNI directories). holdfast-payload.service runs before containerd.service: the
# daemon reads it at its start.
if [ -e "$src/site/containerd.toml" ]; then
	install -D -m 0644 "$src/site/containerd.toml" /etc/containerd/config.toml
fi
# A site whose state key is sealed by the gateway's TPM (stateKeyTPM) removes the raw key the
# bundle's install.sh made, as docs/security.md says: holdfast refuses a raw key there, and
# makes a new key sealed by the TPM at its first start.
if grep -q '^stateKeyTPM:' /etc/holdfast/config.yaml; then
	rm -f /etc/holdfast/state.key
fi
