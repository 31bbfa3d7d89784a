package manifest

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

const twoContainers = `
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: docker.io/holdfast/busybox:test
    command: ["sleep", "3600"]
  - name: side
    image: busybox
`

func TestDecodeAndMakeStatic(t *testing.T) {
	pod, err := Decode([]byte(twoContainers))
	if err != nil {
		t.Fatal(err)
	}
	if err := MakeStatic(pod, "gw-1", "/etc/holdfast/manifests/web.yaml"); err != nil {
		t.Fatal(err)
	}
	if pod.Name != "web-gw-1" || pod.Namespace != "default" || pod.Spec.NodeName != "gw-1" {
		t.Errorf("identity = %s/%s on %q", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	if len(pod.UID) != 32 || !IsStatic(pod) {
		t.Errorf("uid %q, static %v", pod.UID, IsStatic(pod))
	}
	if got := pod.Spec.Containers[0].ImagePullPolicy; got != v1.PullIfNotPresent {
		t.Errorf("tagged image pull policy = %s", got)
	}
	if got := pod.Spec.Containers[1].ImagePullPolicy; got != v1.PullAlways {
		t.Errorf("untagged image pull policy = %s", got)
	}
	if *pod.Spec.TerminationGracePeriodSeconds != 30 || pod.Spec.RestartPolicy != v1.RestartPolicyAlways {
		t.Errorf("defaults not applied: %+v", pod.Spec)
	}

	again, _ := Decode([]byte(twoContainers))
	_ = MakeStatic(again, "gw-1", "/etc/holdfast/manifests/web.yaml")
	if again.UID != pod.UID {
		t.Errorf("same manifest gave UIDs %s and %s", pod.UID, again.UID)
	}
	edited, _ := Decode([]byte(strings.Replace(twoContainers, "3600", "3601", 1)))
	_ = MakeStatic(edited, "gw-1", "/etc/holdfast/manifests/web.yaml")
	if edited.UID == pod.UID {
		t.Error("an edited manifest kept its UID")
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "  \n", "empty"},
		{"not yaml", "{{{", "parse"},
		{"deployment", "apiVersion: apps/v1\nkind: Deployment\n", "only v1 Pod"},
		{"unknown field", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containerz: []}\n", "unknown field"},
		{"huge", strings.Repeat("#", MaxSize+1), "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no containers", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n", "spec.containers: Required"},
		{"no image", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n", "spec.containers[0].image: Required"},
		{"bad name", "apiVersion: v1\nkind: Pod\nmetadata: {name: A_b}\nspec: {containers: [{name: c, image: x}]}\n", "metadata.name: Invalid"},
		{"duplicate", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x}, {name: c, image: y}]}\n", "Duplicate"},
		{"bad policy", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {restartPolicy: Sometimes, containers: [{name: c, image: x}]}\n", "restartPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := Decode([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			err = MakeStatic(pod, "n", "/f")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
