package integration

import (
	"context"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

func cmRef(name, key string, optional bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: &optional}}
}

func secretRef(name, key string, optional bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: &optional}}
}

// TestEnvFromAPIObjects: a container's env from configMapKeyRef, secretKeyRef (optional ones
// left out when missing), resourceFieldRef (with divisors; no cpu limit reads the node's
// allocatable cpu), fieldRef, envFrom with and without prefix, and $(VAR) expansion of envFrom
// variables, as the container itself prints it. A pod whose env names a missing Secret waits
// with CreateContainerConfigError beside it, and starts once the Secret exists.
func TestEnvFromAPIObjects(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	core := e.cp.Admin.CoreV1()
	if _, err := core.ConfigMaps("default").Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "env-config"},
		Data: map[string]string{"LEVEL": "debug", "greeting": "hello"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "env-secret"},
		Data: map[string][]byte{"TOKEN": []byte("t0k3n")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	div := func(s string) resource.Quantity { return resource.MustParse(s) }
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "envs"}, Spec: v1.PodSpec{
		NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{
			Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
			Command: []string{"sh", "-c", "env; exec sleep 3600"},
			Resources: v1.ResourceRequirements{
				Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi")},
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("16Mi")},
			},
			EnvFrom: []v1.EnvFromSource{
				{Prefix: "CFG_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "env-config"}}},
				{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "env-secret"}}},
				{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "not-there"}, Optional: ptr.To(true)}},
			},
			Env: []v1.EnvVar{
				{Name: "LEVEL", ValueFrom: cmRef("env-config", "LEVEL", false)},
				{Name: "SECRET_TOKEN", ValueFrom: secretRef("env-secret", "TOKEN", false)},
				{Name: "OPTIONAL_CM", ValueFrom: cmRef("not-there", "x", true)},
				{Name: "OPTIONAL_KEY", ValueFrom: secretRef("env-secret", "absent", true)},
				{Name: "POD_NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "MEM_LIMIT_MI", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.memory", Divisor: div("1Mi")}}},
				{Name: "MEM_REQUEST", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "requests.memory"}}},
				{Name: "CPU_REQUEST_M", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "requests.cpu", Divisor: div("1m")}}},
				{Name: "CPU_LIMIT", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.cpu"}}},
				{Name: "MSG", Value: "$(CFG_greeting) from $(POD_NAME) at $(LEVEL), $$(LEVEL) literally"},
			},
		}},
	}}
	created, err := core.Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	missing := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "env-missing"}, Spec: v1.PodSpec{
		NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"},
			Env: []v1.EnvVar{{Name: "P", ValueFrom: secretRef("late-env-secret", "password", false)}}}},
	}}
	if _, err := core.Pods("default").Create(ctx, missing, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	logPath := filepath.Join(e.agent.Config.PodLogDir, "default_envs_"+string(created.UID), "c", "0.log")
	var got map[string]string
	testenv.Eventually(t, 90*time.Second, "the container's env in its log", func() error {
		var err error
		if got, err = containerEnvFromLog(logPath); err != nil || got["MSG"] == "" {
			return fmt.Errorf("%v (status: %s)", err, podStatusSummary(ctx, e, "envs"))
		}
		return nil
	})
	for k, want := range map[string]string{
		"LEVEL": "debug", "SECRET_TOKEN": "t0k3n", "TOKEN": "t0k3n", "CFG_LEVEL": "debug", "CFG_greeting": "hello",
		"POD_NAME": "envs", "MEM_LIMIT_MI": "32", "MEM_REQUEST": strconv.Itoa(16 << 20), "CPU_REQUEST_M": "100",
		"CPU_LIMIT": strconv.Itoa(goruntime.NumCPU()), // no limit: the node's allocatable cpu
		"MSG":       "hello from envs at debug, $(LEVEL) literally",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	for _, k := range []string{"OPTIONAL_CM", "OPTIONAL_KEY"} {
		if v, ok := got[k]; ok {
			t.Errorf("%s = %q, want it left out (optional and missing)", k, v)
		}
	}

	testenv.Eventually(t, 60*time.Second, "CreateContainerConfigError for the missing secret", func() error {
		p, err := core.Pods("default").Get(ctx, "env-missing", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return fmt.Errorf("%s", podStatusSummary(ctx, e, "env-missing"))
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		if w.Reason != "CreateContainerConfigError" || w.Message != `secret "late-env-secret" not found` {
			return fmt.Errorf("waiting %+v", w)
		}
		return nil
	})
	if _, err := core.Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "late-env-secret"},
		Data: map[string][]byte{"password": []byte("x")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	volRunning(t, e, "env-missing")
}
