package policy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func placeholder(policyName string) *corev1.Probe {
	cmd := []string{ProbePlaceholderCommand}
	if policyName != "" {
		cmd = append(cmd, policyName)
	}
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}, PeriodSeconds: 5}
}

func testPod(annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: annotations},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "sidecar", ReadinessProbe: placeholder("")}},
			Containers: []corev1.Container{
				{Name: "app", ReadinessProbe: placeholder("app-ready"), LivenessProbe: placeholder(""),
					StartupProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/"}}}},
				{Name: "db"},
			},
		},
	}
}

func TestParseProbeAnnotations(t *testing.T) {
	cases := []struct {
		name string
		ann  map[string]string
		refs []string // container.kind=policy
		err  string
	}{
		{"none", map[string]string{"other/x": "y"}, nil, ""},
		{"readiness and liveness", map[string]string{
			"probe.holdfast.dev/app.readiness": "app-ready",
			"probe.holdfast.dev/app.liveness":  "app-alive",
		}, []string{"app.liveness=app-alive", "app.readiness=app-ready"}, ""},
		{"startup replaces another handler", map[string]string{"probe.holdfast.dev/app.startup": "warmup"}, []string{"app.startup=warmup"}, ""},
		{"sidecar", map[string]string{"probe.holdfast.dev/sidecar.readiness": "side"}, []string{"sidecar.readiness=side"}, ""},
		{"no such container", map[string]string{"probe.holdfast.dev/web.readiness": "x"}, nil, `no container "web"`},
		{"no probe to carry timings", map[string]string{"probe.holdfast.dev/db.liveness": "x"}, nil, "no livenessProbe"},
		{"bad kind", map[string]string{"probe.holdfast.dev/app.health": "x"}, nil, "liveness, readiness or startup"},
		{"no kind", map[string]string{"probe.holdfast.dev/app": "x"}, nil, "key must be"},
		{"placeholder names another policy", map[string]string{"probe.holdfast.dev/app.readiness": "other"}, nil, `names policy "app-ready"`},
		{"bad policy name", map[string]string{"probe.holdfast.dev/app.liveness": "Not A Name"}, nil, "not a policy name"},
		{"one good one bad", map[string]string{
			"probe.holdfast.dev/app.liveness": "alive",
			"probe.holdfast.dev/db.liveness":  "x",
		}, []string{"app.liveness=alive"}, "no livenessProbe"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			refs, err := ParseProbeAnnotations(testPod(tc.ann))
			var got []string
			for _, r := range refs {
				got = append(got, r.Container+"."+string(r.Kind)+"="+r.Policy)
				if r.Probe == nil {
					t.Errorf("%v has no probe", r)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.refs, ",") {
				t.Errorf("refs = %v, want %v", got, tc.refs)
			}
			if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err = %v, want %q", err, tc.err)
			}
		})
	}
}

func TestWasmProbe(t *testing.T) {
	pod := testPod(map[string]string{
		ProbeAnnotation("app", Readiness): "app-ready",
		ProbeAnnotation("db", Liveness):   "broken", // db has no liveness probe
	})
	if name, ok, err := WasmProbe(pod, "app", Readiness); err != nil || !ok || name != "app-ready" {
		t.Fatalf("app readiness: %q %v %v", name, ok, err)
	}
	if _, ok, err := WasmProbe(pod, "app", Liveness); err != nil || ok {
		t.Fatalf("app liveness: %v %v", ok, err)
	}
	if _, _, err := WasmProbe(pod, "db", Liveness); err == nil {
		t.Fatal("db liveness: no error")
	}
	if !IsPlaceholder(pod.Spec.Containers[0].ReadinessProbe) || IsPlaceholder(pod.Spec.Containers[0].StartupProbe) {
		t.Fatal("IsPlaceholder")
	}
}
