package admission

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func withPorts(ports ...v1.ContainerPort) *v1.Pod {
	p := pod("", "", nil)
	p.Spec.Containers[0].Ports = ports
	return p
}

// TestHostPortConflicts: a pod asking for a hostPort another admitted pod holds, on the same
// protocol and an overlapping host IP, is rejected as the kubelet rejects it.
func TestHostPortConflicts(t *testing.T) {
	tcp8080 := v1.ContainerPort{ContainerPort: 80, HostPort: 8080, Protocol: v1.ProtocolTCP}
	sidecar := pod("", "", nil)
	sidecar.Spec.InitContainers = []v1.Container{{Name: "s", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways), Ports: []v1.ContainerPort{tcp8080}}}
	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		admitted []*v1.Pod
		conflict bool
	}{
		{"free port", withPorts(tcp8080), []*v1.Pod{withPorts(v1.ContainerPort{ContainerPort: 80, HostPort: 8081, Protocol: v1.ProtocolTCP})}, false},
		{"same port and protocol", withPorts(tcp8080), []*v1.Pod{withPorts(tcp8080)}, true},
		{"same port, other protocol", withPorts(v1.ContainerPort{ContainerPort: 80, HostPort: 8080, Protocol: v1.ProtocolUDP}), []*v1.Pod{withPorts(tcp8080)}, false},
		{"other host IPs", withPorts(v1.ContainerPort{ContainerPort: 80, HostPort: 8080, HostIP: "192.0.2.1"}),
			[]*v1.Pod{withPorts(v1.ContainerPort{ContainerPort: 80, HostPort: 8080, HostIP: "192.0.2.2"})}, false},
		{"a specific IP against all IPs", withPorts(v1.ContainerPort{ContainerPort: 80, HostPort: 8080, HostIP: "192.0.2.1"}), []*v1.Pod{withPorts(tcp8080)}, true},
		{"all IPs against a specific IP", withPorts(tcp8080), []*v1.Pod{withPorts(v1.ContainerPort{ContainerPort: 80, HostPort: 8080, HostIP: "192.0.2.1", Protocol: v1.ProtocolTCP})}, true},
		{"held by a sidecar", withPorts(tcp8080), []*v1.Pod{sidecar}, true},
		{"no hostPort", withPorts(v1.ContainerPort{ContainerPort: 8080}), []*v1.Pod{withPorts(tcp8080)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.pod, Node{}, tc.admitted)
			if !tc.conflict {
				if !r.Admitted {
					t.Fatalf("rejected: %+v", r)
				}
				return
			}
			want := Result{Reason: "NodePorts", Message: "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"}
			if r != want {
				t.Fatalf("Check = %+v, want %+v", r, want)
			}
		})
	}
}
