#!/bin/bash
# make run: holdfast on this machine with its embedded defaults, standalone, running the
# example static pods of firmware/manifests with a pod network, and showing their status as it
# changes until Ctrl-C. Installs what is missing like `make test` does.
#
# Uses the containerd at $HOLDFAST_CONTAINERD if set and reachable; otherwise starts a private
# one under $RUN_DIR that is stopped (with the demo's containers) on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${CACHE:-/var/cache/holdfast}
RUN_DIR=${RUN_DIR:-/var/lib/holdfast-run}
HEALTHZ=${HEALTHZ:-127.0.0.1:10248}

if [[ $(id -u) != 0 ]]; then
	echo "make run needs root (containers, network namespaces)" >&2
	exit 1
fi
hack/deps.sh
go run ./hack/mkimage -o "$CACHE/images"
go build -tags grpcnotrace -o bin/ ./cmd/holdfast ./cmd/holdfast-logger

mkdir -p "$RUN_DIR"/{cni,state,logs,netns}
# The demo's pod network: the firmware's bridge, under a name and subnet of its own so it
# never collides with a real holdfast0 on this machine.
sed -e 's/"holdfast0"/"hfdemo0"/' -e 's#10.88.0.0/16#10.89.0.0/24#' -e 's/"name": "holdfast"/"name": "holdfast-demo"/' \
	firmware/cni/10-holdfast.conflist > "$RUN_DIR/cni/10-holdfast.conflist"

containerd_pid=""
address=${HOLDFAST_CONTAINERD:-}
if [[ -z $address || ! -S $address ]]; then
	address="$RUN_DIR/containerd.sock"
	cat > "$RUN_DIR/containerd.toml" <<TOML
version = 2
root = "$RUN_DIR/containerd/root"
state = "$RUN_DIR/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$address"
[ttrpc]
  address = "$address.ttrpc"
TOML
	setsid containerd --config "$RUN_DIR/containerd.toml" > "$RUN_DIR/containerd.log" 2>&1 &
	containerd_pid=$!
	for _ in $(seq 50); do [[ -S $address ]] && break; sleep 0.1; done
	echo "started a private containerd at $address (log: $RUN_DIR/containerd.log)"
fi

agent_pid=""
watch_pid=""
cleanup() {
	trap - EXIT INT TERM
	[[ -n $watch_pid ]] && kill "$watch_pid" 2>/dev/null || true
	echo
	if [[ -n $agent_pid ]]; then
		kill "$agent_pid" 2>/dev/null || true
		wait "$agent_pid" 2>/dev/null || true
	fi
	if [[ -n $containerd_pid ]]; then
		echo "stopping the demo's containers and the private containerd"
		for id in $(ctr -a "$address" -n holdfast tasks ls -q 2>/dev/null); do
			ctr -a "$address" -n holdfast tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
		done
		sleep 1
		for id in $(ctr -a "$address" -n holdfast containers ls -q 2>/dev/null); do
			ctr -a "$address" -n holdfast tasks delete -f "$id" >/dev/null 2>&1 || true
			ctr -a "$address" -n holdfast containers delete "$id" >/dev/null 2>&1 || true
		done
		kill "$containerd_pid" 2>/dev/null || true
		wait "$containerd_pid" 2>/dev/null || true
		for ns in "$RUN_DIR"/netns/*; do
			[[ -e $ns ]] && { umount "$ns" 2>/dev/null || true; rm -f "$ns"; }
		done
		rm -rf "$RUN_DIR/state/network" "$RUN_DIR/state/pods"
		ip link delete hfdemo0 2>/dev/null || true
	fi
}
trap cleanup EXIT INT TERM

bin/holdfast run --config firmware/config.yaml \
	--node-name "$(hostname | tr 'A-Z' 'a-z')" \
	--containerd-address "$address" \
	--manifest-dir firmware/manifests \
	--image-preload-dir "$CACHE/images" \
	--state-dir "$RUN_DIR/state" \
	--pod-log-dir "$RUN_DIR/logs" \
	--cni-conf-dir "$RUN_DIR/cni" \
	--netns-dir "$RUN_DIR/netns" \
	--healthz-address "$HEALTHZ" \
	> "$RUN_DIR/holdfast.log" 2>&1 &
agent_pid=$!
echo "holdfast is running (log: $RUN_DIR/holdfast.log, container logs: $RUN_DIR/logs)."
echo "Pods as holdfast reports them; Ctrl-C to stop."
bin/holdfast pods --watch --socket "$RUN_DIR/state/api.sock" &
watch_pid=$!
wait "$agent_pid" || true
