package gateway

import (
	"crypto/sha256"
	"encoding/hex"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// The pods of the scenarios, written as users write them: the API's defaults on (the default
// service-account token is mounted, imagePullPolicy defaults), configuration from a ConfigMap
// and a Secret as volumes and env, probes of each kind. Images are the preloaded test images.

const appScript = `set -e
echo "env greeting=$GREETING password=$PASSWORD level=$LEVEL user=$USERNAME"
echo "volumes greeting=$(cat /etc/app/greeting) password=$(cat /etc/secret/password) token=$(wc -c </var/run/secrets/kubernetes.io/serviceaccount/token) ca=$(grep -c CERTIFICATE /var/run/secrets/kubernetes.io/serviceaccount/ca.crt)"
if [ -f /data/stamp ]; then echo "stamp kept $(cat /data/stamp)"; else cat /proc/sys/kernel/random/uuid >/data/stamp; echo "stamp new $(cat /data/stamp)"; fi
mkdir -p /www && echo ok >/www/index.html && touch /tmp/ready
exec httpd -f -p 8080 -h /www
`

// appConfig and appSecret are what the app pod reads.
func appConfig() *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app-config", Namespace: "default"},
		Data: map[string]string{"greeting": "hello", "LEVEL": "debug"}}
}

func appSecret() *v1.Secret {
	return &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-secret", Namespace: "default"},
		StringData: map[string]string{"password": "s3cret", "USERNAME": "gw"}}
}

// appLogWant are lines the app pod's log holds when it saw all its configuration.
var appLogWant = []string{
	"env greeting=hello password=s3cret level=debug user=gw",
	"volumes greeting=hello password=s3cret token=",
}

// appPod is a web server that reads its configuration from a ConfigMap and a Secret (volumes
// and env), keeps a stamp in an emptyDir, and has a startup, a liveness and a readiness probe.
func appPod(name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: v1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(2)),
			Containers: []v1.Container{{
				Name:    "main",
				Image:   testenv.BusyboxImage,
				Command: []string{"sh", "-c", appScript},
				Env: []v1.EnvVar{
					{Name: "GREETING", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{
						LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}, Key: "greeting"}}},
					{Name: "PASSWORD", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
						LocalObjectReference: v1.LocalObjectReference{Name: "app-secret"}, Key: "password"}}},
				},
				EnvFrom: []v1.EnvFromSource{
					{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}}},
					{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-secret"}}},
				},
				VolumeMounts: []v1.VolumeMount{
					{Name: "config", MountPath: "/etc/app"},
					{Name: "secret", MountPath: "/etc/secret"},
					{Name: "data", MountPath: "/data"},
				},
				StartupProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
					PeriodSeconds: 1, FailureThreshold: 120},
				LivenessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/index.html", Port: intstr.FromInt32(8080)}},
					PeriodSeconds: 5, TimeoutSeconds: 5, FailureThreshold: 6},
				// An exec probe starts runc in the guest: under software emulation on a loaded
				// host that alone took over 5 seconds, so the timeout is generous.
				ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"cat", "/tmp/ready"}}},
					PeriodSeconds: 5, TimeoutSeconds: 30},
			}},
			Volumes: []v1.Volume{
				{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}}}},
				{Name: "secret", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "app-secret"}}},
				{Name: "data", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			},
		},
	}
}

// sleeperPod is a plain long-running pod (the default token mounted, nothing else).
func sleeperPod(name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(2)),
			Containers: []v1.Container{{
				Name:    "main",
				Image:   testenv.BusyboxImage,
				Command: []string{"sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"},
			}},
		},
	}
}

// passwordPod takes a password the two ways users hand one over: inline in its env
// (INLINE_PASSWORD, inlineValue) and from a Secret's key in its env (API_TOKEN, key "token" of
// secretName). It logs a digest of each (passwordDigest), never the values: its log shows
// what it got without putting them on the disk itself.
func passwordPod(name, inlineValue, secretName string) *v1.Pod {
	pod := sleeperPod(name)
	pod.Spec.Containers[0].Command = []string{"sh", "-c", `digest() { printf %s "$1" | sha256sum | cut -c1-16; }
echo "env inline=$(digest "$INLINE_PASSWORD") token=$(digest "$API_TOKEN")"
trap 'exit 0' TERM; while true; do sleep 1; done`}
	pod.Spec.Containers[0].Env = []v1.EnvVar{
		{Name: "INLINE_PASSWORD", Value: inlineValue},
		{Name: "API_TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
			LocalObjectReference: v1.LocalObjectReference{Name: secretName}, Key: "token"}}},
	}
	return pod
}

// passwordDigest is the digest passwordPod logs of a value.
func passwordDigest(value string) string {
	sum := sha256.Sum256([]byte(value))
	return hex.EncodeToString(sum[:])[:16]
}

// limitedPod is Guaranteed: cpu 200m and memory 64Mi, requests equal to limits.
func limitedPod(name string) *v1.Pod {
	pod := sleeperPod(name)
	pod.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("200m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	return pod
}

// oomPod reads 64 MiB into one buffer under a 32Mi limit, once.
func oomPod(name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PodSpec{
			RestartPolicy:                 v1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To(int64(2)),
			Containers: []v1.Container{{
				Name:      "hog",
				Image:     testenv.BusyboxImage,
				Command:   []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=4"},
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi")}},
			}},
		},
	}
}

// staticPods are the firmware's static manifests (firmware/manifests), by mirror pod name.
var staticPods = []string{"uplink-monitor-" + nodeName, "web-" + nodeName}

// resizablePod is Guaranteed at cpu 200m and memory 64Mi, resized in place for both.
func resizablePod(name string) *v1.Pod {
	pod := limitedPod(name)
	pod.Spec.Containers[0].ResizePolicy = []v1.ContainerResizePolicy{
		{ResourceName: v1.ResourceCPU, RestartPolicy: v1.NotRequired},
		{ResourceName: v1.ResourceMemory, RestartPolicy: v1.NotRequired},
	}
	return pod
}

// hogPod has no limit and holds 600 MiB (tail keeps a line it has not seen the end of).
func hogPod(name string) *v1.Pod {
	pod := oomPod(name)
	pod.Spec.Containers[0].Command = []string{"sh", "-c", "head -c 600m /dev/zero | tail"}
	pod.Spec.Containers[0].Resources = v1.ResourceRequirements{}
	return pod
}
