package podutil

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func requirements(req, lim string) v1.ResourceRequirements {
	list := func(s string) v1.ResourceList {
		if s == "" {
			return nil
		}
		return v1.ResourceList{v1.ResourceCPU: resource.MustParse(s), v1.ResourceMemory: resource.MustParse(s)}
	}
	return v1.ResourceRequirements{Requests: list(req), Limits: list(lim)}
}

func TestComputePodQOS(t *testing.T) {
	for _, tt := range []struct {
		name       string
		init, main []v1.ResourceRequirements
		podLevel   *v1.ResourceRequirements
		want       v1.PodQOSClass
	}{
		{"none", nil, []v1.ResourceRequirements{{}}, nil, v1.PodQOSBestEffort},
		{"no containers", nil, nil, nil, v1.PodQOSBestEffort},
		{"equal", nil, []v1.ResourceRequirements{requirements("1", "1")}, nil, v1.PodQOSGuaranteed},
		{"limits only are requests", nil, []v1.ResourceRequirements{{Limits: requirements("", "1").Limits}}, nil, v1.PodQOSBurstable},
		{"request below limit", nil, []v1.ResourceRequirements{requirements("1", "2")}, nil, v1.PodQOSBurstable},
		{"guaranteed and best effort", nil, []v1.ResourceRequirements{requirements("1", "1"), {}}, nil, v1.PodQOSBurstable},
		{"an init container counts", []v1.ResourceRequirements{{}}, []v1.ResourceRequirements{requirements("1", "1")}, nil, v1.PodQOSBurstable},
		{"cpu only", nil, []v1.ResourceRequirements{{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")},
			Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")},
		}}, nil, v1.PodQOSBurstable},
		{"pod level decides", nil, []v1.ResourceRequirements{{}}, &v1.ResourceRequirements{Requests: requirements("1", "1").Requests, Limits: requirements("1", "1").Limits}, v1.PodQOSGuaranteed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: v1.PodSpec{Resources: tt.podLevel}}
			for _, r := range tt.init {
				pod.Spec.InitContainers = append(pod.Spec.InitContainers, v1.Container{Resources: r})
			}
			for _, r := range tt.main {
				pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Resources: r})
			}
			if got := ComputePodQOS(pod); got != tt.want {
				t.Errorf("ComputePodQOS = %s, want %s", got, tt.want)
			}
			pod.Status.QOSClass = "Recorded"
			if got := PodQOS(pod); got != "Recorded" {
				t.Errorf("PodQOS = %s, want the status's class", got)
			}
		})
	}
}

func TestFieldPathValue(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "web", Namespace: "ns", UID: "u1",
		Labels:      map[string]string{"b": "2", "a": "1"},
		Annotations: map[string]string{"x/y": "z"},
	}}
	for path, want := range map[string]string{
		"metadata.name":               "web",
		"metadata.namespace":          "ns",
		"metadata.uid":                "u1",
		"metadata.labels":             "a=\"1\"\nb=\"2\"",
		"metadata.labels['a']":        "1",
		"metadata.labels['nope']":     "",
		"metadata.annotations['x/y']": "z",
		"metadata.annotations":        `x/y="z"`,
	} {
		got, err := FieldPathValue(pod, path)
		if err != nil || got != want {
			t.Errorf("FieldPathValue(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	for _, path := range []string{"spec.nodeName", "metadata.name['a']", "metadata.labels['-bad-']"} {
		if got, err := FieldPathValue(pod, path); err == nil {
			t.Errorf("FieldPathValue(%q) = %q, want an error", path, got)
		}
	}
}

func TestContainerResourceValue(t *testing.T) {
	c := &v1.Container{Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m"), v1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("1500m"), "hugepages-2Mi": resource.MustParse("4Mi")},
	}}
	for _, tt := range []struct {
		res, divisor, want string
	}{
		{"requests.cpu", "", "1"}, // rounded up
		{"requests.cpu", "1m", "250"},
		{"limits.cpu", "", "2"},
		{"requests.memory", "1Mi", "64"},
		{"requests.memory", "", "67108864"},
		{"limits.hugepages-2Mi", "1Mi", "4"},
		{"limits.memory", "", "0"},
	} {
		fs := &v1.ResourceFieldSelector{Resource: tt.res}
		if tt.divisor != "" {
			fs.Divisor = resource.MustParse(tt.divisor)
		}
		got, err := ContainerResourceValue(fs, c)
		if err != nil || got != tt.want {
			t.Errorf("%s / %q = %q, %v; want %s", tt.res, tt.divisor, got, err, tt.want)
		}
	}
	if _, err := ContainerResourceValue(&v1.ResourceFieldSelector{Resource: "limits.gpu"}, c); err == nil {
		t.Error("limits.gpu: want an error")
	}
}
