package cri

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkCgroupDriver asks the runtime which cgroup driver it makes containers' cgroups with
// (RuntimeConfig, as the kubelet asks it at start) and fails when it is not want, the
// agent's cgroupDriver: the runtime would otherwise be handed a pod's cgroup parent in the
// other driver's form (containerd's CRI plugin with SystemdCgroup = true takes a slice, with
// false a path), and the pods fail at their sandbox, one by one. Where the kubelet takes the
// runtime's driver for its own, holdfast keeps what its configuration says and says what to
// change. A runtime without RuntimeConfig (containerd before 2.0) cannot tell: the agent's
// driver is used, as the kubelet falls back to its own, and note says so.
func checkCgroupDriver(ctx context.Context, rs criapi.RuntimeServiceClient, want string) (note string, err error) {
	resp, err := rs.RuntimeConfig(ctx, &criapi.RuntimeConfigRequest{})
	return cgroupDriverVerdict(resp, err, want)
}

// cgroupDriverVerdict judges RuntimeConfig's answer (resp, err) against want.
func cgroupDriverVerdict(resp *criapi.RuntimeConfigResponse, err error, want string) (note string, _ error) {
	if status.Code(err) == codes.Unimplemented {
		return fmt.Sprintf("the CRI runtime does not report its cgroup driver (no RuntimeConfig): make sure it uses %s, as cgroupDriver says", want), nil
	}
	if err != nil {
		return "", fmt.Errorf("CRI RuntimeConfig (the runtime's cgroup driver): %w", err)
	}
	linux := resp.GetLinux()
	if linux == nil {
		return "the CRI runtime reports no Linux configuration: its cgroup driver is taken to be " + want, nil
	}
	var got string
	switch d := linux.GetCgroupDriver(); d {
	case criapi.CgroupDriver_SYSTEMD:
		got = "systemd"
	case criapi.CgroupDriver_CGROUPFS:
		got = "cgroupfs"
	default:
		return "", fmt.Errorf("the CRI runtime reports an unknown cgroup driver %d", d)
	}
	if got != want {
		hint := "SystemdCgroup = false"
		if got == "systemd" {
			hint = "SystemdCgroup = true"
		}
		return "", fmt.Errorf("cgroupDriver is %s but the CRI runtime makes cgroups with %s (containerd: %s in its runc options): "+
			"set cgroupDriver: %s, or change the runtime's driver and restart it", want, got, hint, got)
	}
	return "", nil
}
