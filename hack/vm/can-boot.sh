#!/bin/bash
# can-boot.sh decides whether `make test` boots the gateway VM (gatewaytest scenarios 1 and 2):
# yes when /dev/kvm is usable (a boot takes seconds), or when HOLDFAST_GATEWAY_VM=1 asks for it
# under software emulation (a boot takes minutes on 2 cores: see docs/benchmarks.md);
# HOLDFAST_GATEWAY_VM=0 never. Exit status 0 means boot it.
set -euo pipefail
case "${HOLDFAST_GATEWAY_VM:-auto}" in
1) exit 0 ;;
0) exit 1 ;;
esac
# Readable and writable, not merely present: a container may show the node without access.
[[ -r /dev/kvm && -w /dev/kvm ]] && exec 3<>/dev/kvm
