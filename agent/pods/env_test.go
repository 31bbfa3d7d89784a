package pods

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/agent/volumes"
)

func cmKey(name, key string, optional *bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: optional}}
}

func secretKey(name, key string, optional *bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: optional}}
}

func resourceRef(res, divisor string) *v1.EnvVarSource {
	ref := &v1.ResourceFieldSelector{Resource: res}
	if divisor != "" {
		ref.Divisor = resource.MustParse(divisor)
	}
	return &v1.EnvVarSource{ResourceFieldRef: ref}
}

// TestResolveEnv runs env resolution against the real volumes.Manager (the EnvSource holdfast
// uses) over an in-memory clientset: the objects, their absence, and the wording of errors are
// those the agent reports.
func TestResolveEnv(t *testing.T) {
	client := fake.NewClientset(
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cfg"},
			Data: map[string]string{"greeting": "hello", "level": "debug", "A=B": "bad", "ref": "$(GREETING)"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "creds"},
			Data: map[string][]byte{"password": []byte("s3cret"), "user": []byte("admin")}},
	)
	allocatable := v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse("2"),
		v1.ResourceMemory:           resource.MustParse("1Gi"),
		v1.ResourceEphemeralStorage: resource.MustParse("10Gi"),
	}
	vm := volumes.NewManager(t.TempDir(), kubetest.Wrap(client), nil, nil, volumes.Options{Allocatable: func() v1.ResourceList { return allocatable }})

	for _, tc := range []struct {
		name    string
		env     []v1.EnvVar
		envFrom []v1.EnvFromSource
		limits  v1.ResourceList
		source  EnvSource // defaults to vm
		hostNet bool      // the pod uses the host's network
		noAPI   bool
		want    []string // exact KEY=VALUE list, in order
		wantErr string   // substring of the errConfig message
		warning string   // substring of a Warning event
	}{
		{
			name: "literal values expand earlier variables",
			env:  []v1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "$(A)-$(Z)"}},
			want: []string{"A=1", "B=1-$(Z)"},
		},
		{
			name: "fieldRef",
			env: []v1.EnvVar{
				{Name: "POD", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "APP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			},
			want: []string{"POD=web", "IP=10.88.0.5", "APP=demo"},
		},
		{
			name: "configMapKeyRef and secretKeyRef",
			env:  []v1.EnvVar{{Name: "GREETING", ValueFrom: cmKey("cfg", "greeting", nil)}, {Name: "PASSWORD", ValueFrom: secretKey("creds", "password", nil)}},
			want: []string{"GREETING=hello", "PASSWORD=s3cret"},
		},
		{
			name: "values from objects are not expanded",
			env:  []v1.EnvVar{{Name: "GREETING", Value: "x"}, {Name: "REF", ValueFrom: cmKey("cfg", "ref", nil)}},
			want: []string{"GREETING=x", "REF=$(GREETING)"},
		},
		{
			name:    "missing configMap",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: cmKey("nope", "k", nil)}},
			wantErr: `configmap "nope" not found`,
		},
		{
			name: "missing optional configMap leaves the variable out",
			env:  []v1.EnvVar{{Name: "A", Value: "1"}, {Name: "X", ValueFrom: cmKey("nope", "k", ptr.To(true))}},
			want: []string{"A=1"},
		},
		{
			name:    "missing key",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: cmKey("cfg", "absent", nil)}},
			wantErr: "couldn't find key absent in ConfigMap default/cfg",
		},
		{
			name: "missing optional key",
			env:  []v1.EnvVar{{Name: "X", ValueFrom: cmKey("cfg", "absent", ptr.To(true))}},
			want: []string{},
		},
		{
			name:    "missing secret",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: secretKey("nope", "k", ptr.To(false))}},
			wantErr: `secret "nope" not found`,
		},
		{
			name:    "missing secret key",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: secretKey("creds", "token", nil)}},
			wantErr: "couldn't find key token in Secret default/creds",
		},
		{
			name: "missing optional secret",
			env:  []v1.EnvVar{{Name: "X", ValueFrom: secretKey("nope", "k", ptr.To(true))}},
			want: []string{},
		},
		{
			name: "resourceFieldRef with limits, divisors and allocatable defaults",
			limits: v1.ResourceList{
				v1.ResourceMemory: resource.MustParse("64Mi"),
			},
			env: []v1.EnvVar{
				{Name: "MEM_MI", ValueFrom: resourceRef("limits.memory", "1Mi")},
				{Name: "MEM", ValueFrom: resourceRef("limits.memory", "")},
				{Name: "CPU", ValueFrom: resourceRef("limits.cpu", "")},         // no limit: node's 2
				{Name: "CPU_M", ValueFrom: resourceRef("limits.cpu", "1m")},     // 2000
				{Name: "REQ_CPU", ValueFrom: resourceRef("requests.cpu", "1m")}, // 250m
				{Name: "STORAGE_GI", ValueFrom: resourceRef("limits.ephemeral-storage", "1Gi")},
			},
			want: []string{"MEM_MI=64", "MEM=67108864", "CPU=2", "CPU_M=2000", "REQ_CPU=250", "STORAGE_GI=10"},
		},
		{
			name:    "unsupported resource",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: resourceRef("limits.gpu", "")}},
			wantErr: "limits.gpu",
		},
		{
			name: "envFrom with prefixes; env overrides in place; invalid keys skipped with an event",
			envFrom: []v1.EnvFromSource{
				{Prefix: "CFG_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}},
				{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "creds"}}},
			},
			env: []v1.EnvVar{{Name: "user", Value: "root"}, {Name: "MSG", Value: "$(CFG_greeting) $(password)"}},
			want: []string{
				"CFG_greeting=hello", "CFG_level=debug", "CFG_ref=$(GREETING)",
				"password=s3cret", "user=root", "MSG=hello s3cret",
			},
			warning: "Keys [CFG_A=B] from the EnvFrom configMap default/cfg were skipped",
		},
		{
			name: "envFrom optional missing",
			envFrom: []v1.EnvFromSource{
				{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}, Optional: ptr.To(true)}},
				{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}, Optional: ptr.To(true)}},
			},
			want: []string{},
		},
		{
			name:    "envFrom missing secret",
			envFrom: []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}}}},
			wantErr: `secret "nope" not found`,
		},
		{
			name:    "no source at all",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: cmKey("cfg", "greeting", nil)}},
			noAPI:   true,
			wantErr: "couldn't get configMap default/cfg",
		},
		{
			name:    "standalone manager",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: secretKey("creds", "user", nil)}},
			source:  volumes.NewManager(t.TempDir(), nil, nil, nil, volumes.Options{}),
			wantErr: "without an apiserver",
		},
		{
			name: "a host-network pod's IPs are the node's",
			env: []v1.EnvVar{
				{Name: "POD_IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "POD_IPS", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIPs"}}},
				{Name: "HOST_IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			},
			hostNet: true,
			want:    []string{"POD_IP=192.168.1.2", "POD_IPS=192.168.1.2", "HOST_IP=192.168.1.2"},
		},
		{
			name:    "unsupported fieldPath",
			env:     []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.hostname"}}}},
			wantErr: `unsupported fieldPath "spec.hostname"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &v1.Container{Name: "app", Env: tc.env, EnvFrom: tc.envFrom, Resources: v1.ResourceRequirements{
				Limits:   tc.limits,
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m")},
			}}
			pod := &v1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1", Labels: map[string]string{"app": "demo"}},
				Spec:       v1.PodSpec{NodeName: "gw", Containers: []v1.Container{*c}},
			}
			pod.Spec.HostNetwork = tc.hostNet
			var src EnvSource = vm
			if tc.source != nil {
				src = tc.source
			}
			if tc.noAPI {
				src = nil
			}
			var warnings []string
			got, vars, err := resolveEnv(context.Background(), envInput{
				pod: pod, container: c, podIPs: []string{"10.88.0.5"}, hostIPs: []string{"192.168.1.2"},
				source: src, warn: func(reason, msg string) { warnings = append(warnings, reason+": "+msg) },
			})
			if tc.wantErr != "" {
				var ce *errConfig
				if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v (%T), want an errConfig containing %q", err, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Errorf("env = %q\nwant  %q", got, tc.want)
			}
			for _, kv := range got {
				k, v, _ := strings.Cut(kv, "=")
				if vars[k] != v {
					t.Errorf("vars[%q] = %q, env says %q", k, vars[k], v)
				}
			}
			if tc.warning == "" && len(warnings) > 0 {
				t.Errorf("unexpected warnings %q", warnings)
			}
			if tc.warning != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], "InvalidEnvironmentVariableNames: "+tc.warning)) {
				t.Errorf("warnings %q, want one with %q", warnings, tc.warning)
			}
		})
	}
}

// TestResolveEnvStaticPod: a static pod may not read ConfigMaps even when the agent has an
// apiserver (NodeRestriction forbids it to mirror pods); the error says so.
func TestResolveEnvStaticPod(t *testing.T) {
	client := fake.NewClientset(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cfg"}, Data: map[string]string{"k": "v"}})
	vm := volumes.NewManager(t.TempDir(), kubetest.Wrap(client), nil, nil, volumes.Options{})
	c := &v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "X", ValueFrom: cmKey("cfg", "k", nil)}}}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sensor-gw", UID: "u",
		Annotations: map[string]string{"kubernetes.io/config.source": "file"}}}
	_, _, err := resolveEnv(context.Background(), envInput{pod: pod, container: c, source: vm})
	var ce *errConfig
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "static pods may not reference") {
		t.Fatalf("err = %v", err)
	}
}

// TestResolveEnvServiceLinks: service variables come after the container's own, never replace
// them, and a literal value may name them, as with the kubelet.
func TestResolveEnvServiceLinks(t *testing.T) {
	pod := &v1.Pod{}
	c := &v1.Container{Name: "c", Env: []v1.EnvVar{
		{Name: "API", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
		{Name: "DB_SERVICE_HOST", Value: "db.local"},
	}}
	services := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "DB_SERVICE_HOST": "10.96.0.9"}
	got, _, err := resolveEnv(context.Background(), envInput{pod: pod, container: c, services: services})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"API=https://10.96.0.1:443", "DB_SERVICE_HOST=db.local", "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443"}
	if !slices.Equal(got, want) {
		t.Errorf("env:\n got %v\nwant %v", got, want)
	}
}
