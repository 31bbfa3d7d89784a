package admission

import (
	"runtime"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func pod(cpu, mem string, selector map[string]string) *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{NodeSelector: selector, Containers: []v1.Container{{Name: "c"}}}}
	req := v1.ResourceList{}
	if cpu != "" {
		req[v1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		req[v1.ResourceMemory] = resource.MustParse(mem)
	}
	p.Spec.Containers[0].Resources.Requests = req
	return p
}

func withOS(p *v1.Pod, os string) *v1.Pod {
	p.Spec.OS = &v1.PodOS{Name: v1.OSName(os)}
	return p
}

// withOSLabel sets the pod's own kubernetes.io/os label, which kubelet compares with the node's.
func withOSLabel(p *v1.Pod, os string) *v1.Pod {
	p.Labels = map[string]string{v1.LabelOSStable: os}
	return p
}

// withPodLevel gives p pod-level requests (issue 29 item 3), which count instead of its
// containers' where set.
func withPodLevel(p *v1.Pod, cpu, mem string) *v1.Pod {
	q := pod(cpu, mem, nil).Spec.Containers[0].Resources.Requests
	p.Spec.Resources = &v1.ResourceRequirements{Requests: q, Limits: q}
	return p
}

func TestCheck(t *testing.T) {
	node := Node{
		Labels: map[string]string{"site": "plant-7", "kubernetes.io/arch": "arm64"},
		Allocatable: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("1Gi"), v1.ResourcePods: resource.MustParse("3"),
		},
	}
	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		admitted []*v1.Pod
		reason   string
		msg      string
	}{
		{"fits", pod("500m", "256Mi", nil), []*v1.Pod{pod("1", "256Mi", nil)}, "", ""},
		{"best effort always fits cpu", pod("", "", nil), []*v1.Pod{pod("2", "", nil)}, "", ""},
		{"too much cpu", pod("1500m", "", nil), []*v1.Pod{pod("1", "", nil)}, ReasonOutOfCPU, "cpu, requested: 1500, used: 1000, capacity: 2000"},
		{"too much memory", pod("", "900Mi", nil), []*v1.Pod{pod("", "200Mi", nil)}, ReasonOutOfMemory, "memory"},
		{"pod-level requests count, not the containers'", withPodLevel(pod("100m", "", nil), "1500m", ""), []*v1.Pod{pod("1", "", nil)}, ReasonOutOfCPU, "cpu, requested: 1500, used: 1000, capacity: 2000"},
		{"pod-level requests count when admitted", pod("", "600Mi", nil), []*v1.Pod{withPodLevel(pod("", "", nil), "", "500Mi")}, ReasonOutOfMemory, "used: 524288000"},
		{"pod-level requests that fit", withPodLevel(pod("", "900Mi", nil), "1", "300Mi"), []*v1.Pod{pod("1", "700Mi", nil)}, "", ""},
		{"too many pods", pod("", "", nil), []*v1.Pod{pod("", "", nil), pod("", "", nil), pod("", "", nil)}, ReasonOutOfPods, "pods"},
		{"selector matches", pod("", "", map[string]string{"site": "plant-7"}), nil, "", ""},
		{"selector does not match", pod("", "", map[string]string{"site": "plant-8"}), nil, ReasonNodeAffinity, "nodeSelector"},
		{"os field matches", withOS(pod("", "", nil), runtime.GOOS), nil, "", ""},
		{"os field does not match", withOS(pod("", "", nil), "windows"), nil, ReasonPodOSNotSupported, "OS field"},
		{"os label does not match", withOSLabel(pod("", "", nil), "windows"), nil, ReasonPodOSSelector, "kubernetes.io/os"},
		{"os label matches", withOSLabel(pod("", "", nil), runtime.GOOS), nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.pod, node, tc.admitted)
			if tc.reason == "" {
				if !r.Admitted {
					t.Fatalf("rejected: %+v", r)
				}
				return
			}
			if r.Admitted || r.Reason != tc.reason || !strings.Contains(r.Message, tc.msg) {
				t.Errorf("got %+v, want reason %s with %q", r, tc.reason, tc.msg)
			}
			if st := Rejected(r); st.Phase != v1.PodFailed || !strings.HasPrefix(st.Message, "Pod was rejected: ") {
				t.Errorf("rejected status %+v", st)
			}
		})
	}
}
