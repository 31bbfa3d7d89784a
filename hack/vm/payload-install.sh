#!/bin/sh
# payload-install.sh SRC installs holdfast on the test VM from a payload laid out like a
# firmware bundle (gatewaytest/payload.go writes it): the binaries, the systemd unit, the
# default configuration (left alone when one exists), the CNI configuration, the static
# manifests and the preloaded images; then the site's own files (kubeconfig, configuration),
# as a gateway's provisioning would. Idempotent.
set -eu
src=$1

install -D -m 0755 "$src/bin/holdfast" /usr/bin/holdfast
install -D -m 0755 "$src/bin/holdfast-logger" /usr/bin/holdfast-logger
install -D -m 0644 "$src/firmware/systemd/holdfast.service" /etc/systemd/system/holdfast.service
mkdir -p /etc/holdfast/manifests /etc/holdfast/policies /usr/lib/holdfast/images /etc/cni/net.d
[ -e /etc/holdfast/config.yaml ] || install -m 0644 "$src/firmware/config.yaml" /etc/holdfast/config.yaml
install -m 0644 "$src/firmware/cni/"*.conflist /etc/cni/net.d/
for f in "$src/firmware/manifests/"*.yaml; do
	[ -e "$f" ] && install -m 0644 "$f" /etc/holdfast/manifests/
done
for f in "$src/firmware/images/"*.tar; do
	[ -e "$f" ] && install -m 0644 "$f" /usr/lib/holdfast/images/
done

# The site: this gateway's identity and configuration.
if [ -e "$src/site/kubeconfig" ]; then
	install -m 0600 "$src/site/kubeconfig" /etc/holdfast/kubeconfig
fi
if [ -e "$src/site/config.yaml" ]; then
	install -m 0644 "$src/site/config.yaml" /etc/holdfast/config.yaml
fi

systemctl daemon-reload
systemctl enable holdfast.service
