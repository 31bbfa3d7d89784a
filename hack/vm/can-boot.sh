#!/bin/bash
# can-boot.sh decides whether `make test` boots the gateway VM (test/gateway scenarios 1 and 2):
# yes when KVM works here (a boot takes seconds), or when HOLDFAST_GATEWAY_VM=1 asks for it
# under software emulation (a boot takes minutes on 2 cores: see docs/benchmarks.md);
# HOLDFAST_GATEWAY_VM=0 never. Exit status 0 means boot it; otherwise the reason is printed.
set -euo pipefail
case "${HOLDFAST_GATEWAY_VM:-auto}" in
1) exit 0 ;;
0) echo "HOLDFAST_GATEWAY_VM=0" >&2; exit 1 ;;
esac
# Readable and writable, not merely present: a container may show the node without access.
if ! [[ -r /dev/kvm && -w /dev/kvm ]]; then
	echo "no usable /dev/kvm" >&2
	exit 1
fi
# The device may open and KVM still fail (a nested hypervisor): ask qemu itself, installed
# first as the gateway tests install it.
"$(dirname "$0")/deps.sh" >/dev/null
exec "$(dirname "$0")/kvm-works.sh"
