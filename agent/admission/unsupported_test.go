package admission

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestUnsupportedFieldsAreRefused(t *testing.T) {
	node := Node{}
	for _, tc := range []struct {
		field string
		edit  func(p *v1.Pod)
	}{
		{"spec.shareProcessNamespace", func(p *v1.Pod) { p.Spec.ShareProcessNamespace = ptr.To(true) }},
		{"spec.hostUsers", func(p *v1.Pod) { p.Spec.HostUsers = ptr.To(false) }},
		{"procMount", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{ProcMount: ptr.To(v1.UnmaskedProcMount)}
		}},
		{"mountPropagation", func(p *v1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "v", MountPath: "/v", MountPropagation: ptr.To(v1.MountPropagationHostToContainer)}}
		}},
		{"mountPropagation", func(p *v1.Pod) { // on an ephemeral container too
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debug",
				VolumeMounts: []v1.VolumeMount{{Name: "v", MountPath: "/v", MountPropagation: ptr.To(v1.MountPropagationBidirectional)}}}}}
		}},
		{"spec.runtimeClassName", func(p *v1.Pod) { p.Spec.RuntimeClassName = ptr.To("kata") }},
		{"initContainers[].restartPolicy other than Always", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "init", RestartPolicy: ptr.To(v1.ContainerRestartPolicyNever)}}
		}},
		{"restartPolicyRules with an action other than Restart", func(p *v1.Pod) {
			p.Spec.Containers[0].RestartPolicy = ptr.To(v1.ContainerRestartPolicyNever)
			p.Spec.Containers[0].RestartPolicyRules = []v1.ContainerRestartRule{{Action: "RestartAllContainers",
				ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}}}
		}},
		{"or on an init container", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "init", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways),
				RestartPolicyRules: []v1.ContainerRestartRule{{Action: v1.ContainerRestartRuleActionRestart,
					ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}}}}}
		}},
		{"stdin: true without tty: true", func(p *v1.Pod) { p.Spec.Containers[0].Stdin = true }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			p := pod("", "", nil)
			tc.edit(p)
			r := Check(p, node, nil)
			if r.Admitted || r.Reason != ReasonUnsupported || !strings.Contains(r.Message, tc.field) {
				t.Fatalf("Check = %+v, want rejected with reason %s naming %q", r, ReasonUnsupported, tc.field)
			}
		})
	}

	// What the API sets by default, or asks for nothing beyond what holdfast does, is admitted.
	p := pod("", "", nil)
	p.Spec.DNSPolicy = v1.DNSClusterFirst
	p.Spec.EnableServiceLinks = ptr.To(true)
	p.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault},
		AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}}
	p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{ProcMount: ptr.To(v1.DefaultProcMount)}
	p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "v", MountPath: "/v", MountPropagation: ptr.To(v1.MountPropagationNone)}}
	p.Spec.RuntimeClassName = ptr.To("")
	p.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"192.0.2.53"}}
	p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}
	p.Spec.Containers[0].Stdin, p.Spec.Containers[0].StdinOnce, p.Spec.Containers[0].TTY = true, true, true
	if r := Check(p, node, nil); !r.Admitted {
		t.Fatalf("a pod with only defaults was rejected: %+v", r)
	}

	// Implemented: no longer refused (sysctls and AppArmor have checks of their own).
	p = pod("", "", nil)
	p.Spec.HostPID, p.Spec.HostIPC = true, true
	p.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: ptr.To[int64](2000), FSGroupChangePolicy: ptr.To(v1.FSGroupChangeOnRootMismatch),
		SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("audit.json")}}
	p.Spec.InitContainers = []v1.Container{{Name: "sidecar", Image: "img", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways)}}
	p.Spec.Containers[0].RestartPolicy = ptr.To(v1.ContainerRestartPolicyNever)
	p.Spec.Containers[0].RestartPolicyRules = []v1.ContainerRestartRule{{Action: v1.ContainerRestartRuleActionRestart,
		ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}}}
	// Pod-level resources (issue 29 item 3) bound the pod cgroup.
	p.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")},
		Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}}
	if r := Check(p, node, nil); !r.Admitted {
		t.Fatalf("a pod using implemented fields was rejected: %+v", r)
	}
}
