// Package manifest reads Pod manifests (YAML or JSON), fills in the defaults the API server
// would, validates them the way the API would for the fields holdfast acts on, and gives
// static pods their node-scoped identity as kubelet does.
package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// MaxSize bounds a manifest file: a pod spec is a few KiB, and an unbounded read is how YAML
// bombs hurt (CVE-2019-11253).
const MaxSize = 1 << 20

// Annotations kubelet puts on static pods; mirror pods carry MirrorAnnotation.
const (
	ConfigSourceAnnotation = "kubernetes.io/config.source"
	ConfigHashAnnotation   = "kubernetes.io/config.hash"
	MirrorAnnotation       = "kubernetes.io/config.mirror"
	SourceFile             = "file"
	SourceAPI              = "api"
)

// Decode parses one Pod from YAML or JSON. Unknown fields are errors: a misspelt field would
// otherwise be dropped silently and the pod run without it.
func Decode(data []byte) (*v1.Pod, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("manifest is %d bytes, more than the %d allowed", len(data), MaxSize)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("manifest is empty")
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	if tm.Kind != "Pod" || (tm.APIVersion != "v1" && tm.APIVersion != "") {
		return nil, fmt.Errorf("manifest has apiVersion %q kind %q: only v1 Pod is supported", tm.APIVersion, tm.Kind)
	}
	var pod v1.Pod
	if err := yaml.UnmarshalStrict(data, &pod); err != nil {
		return nil, fmt.Errorf("parse pod manifest: %w", err)
	}
	return &pod, nil
}

// SetDefaults fills the fields the API server defaults, so a static pod behaves exactly as
// the same spec created through the API.
func SetDefaults(pod *v1.Pod) {
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	s := &pod.Spec
	if s.RestartPolicy == "" {
		s.RestartPolicy = v1.RestartPolicyAlways
	}
	if s.DNSPolicy == "" {
		s.DNSPolicy = v1.DNSClusterFirst
	}
	if s.TerminationGracePeriodSeconds == nil {
		g := int64(v1.DefaultTerminationGracePeriodSeconds)
		s.TerminationGracePeriodSeconds = &g
	}
	if s.SchedulerName == "" {
		s.SchedulerName = v1.DefaultSchedulerName
	}
	if s.SecurityContext == nil {
		s.SecurityContext = &v1.PodSecurityContext{}
	}
	for i := range s.InitContainers {
		defaultContainer(&s.InitContainers[i])
	}
	for i := range s.Containers {
		defaultContainer(&s.Containers[i])
	}
}

func defaultContainer(c *v1.Container) {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = DefaultPullPolicy(c.Image)
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = v1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = v1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = v1.ProtocolTCP
		}
	}
}

// DefaultPullPolicy is the API's rule: Always for ":latest" or an untagged image,
// IfNotPresent otherwise.
func DefaultPullPolicy(image string) v1.PullPolicy {
	name := image
	if i := strings.LastIndex(name, "@"); i >= 0 {
		return v1.PullIfNotPresent
	}
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	tag := ""
	if i := strings.LastIndex(name, ":"); i >= 0 {
		tag = name[i+1:]
	}
	if tag == "" || tag == "latest" {
		return v1.PullAlways
	}
	return v1.PullIfNotPresent
}

// Validate checks what the API server would refuse among the fields holdfast uses. It
// returns every problem at once, each naming its field.
func Validate(pod *v1.Pod) error {
	var errs field.ErrorList
	meta := field.NewPath("metadata")
	if pod.Name == "" {
		errs = append(errs, field.Required(meta.Child("name"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(pod.Name) {
			errs = append(errs, field.Invalid(meta.Child("name"), pod.Name, msg))
		}
	}
	for _, msg := range validation.IsDNS1123Label(pod.Namespace) {
		errs = append(errs, field.Invalid(meta.Child("namespace"), pod.Namespace, msg))
	}
	spec := field.NewPath("spec")
	if len(pod.Spec.Containers) == 0 {
		errs = append(errs, field.Required(spec.Child("containers"), "a pod needs at least one container"))
	}
	names := map[string]bool{}
	check := func(p *field.Path, cs []v1.Container) {
		for i, c := range cs {
			cp := p.Index(i)
			if c.Name == "" {
				errs = append(errs, field.Required(cp.Child("name"), ""))
			} else {
				for _, msg := range validation.IsDNS1123Label(c.Name) {
					errs = append(errs, field.Invalid(cp.Child("name"), c.Name, msg))
				}
				if names[c.Name] {
					errs = append(errs, field.Duplicate(cp.Child("name"), c.Name))
				}
				names[c.Name] = true
			}
			if strings.TrimSpace(c.Image) == "" {
				errs = append(errs, field.Required(cp.Child("image"), ""))
			}
			switch c.ImagePullPolicy {
			case v1.PullAlways, v1.PullIfNotPresent, v1.PullNever, "":
			default:
				errs = append(errs, field.NotSupported(cp.Child("imagePullPolicy"), c.ImagePullPolicy,
					[]string{string(v1.PullAlways), string(v1.PullIfNotPresent), string(v1.PullNever)}))
			}
		}
	}
	check(spec.Child("initContainers"), pod.Spec.InitContainers)
	check(spec.Child("containers"), pod.Spec.Containers)
	switch pod.Spec.RestartPolicy {
	case v1.RestartPolicyAlways, v1.RestartPolicyOnFailure, v1.RestartPolicyNever, "":
	default:
		errs = append(errs, field.NotSupported(spec.Child("restartPolicy"), pod.Spec.RestartPolicy,
			[]string{string(v1.RestartPolicyAlways), string(v1.RestartPolicyOnFailure), string(v1.RestartPolicyNever)}))
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		errs = append(errs, field.Invalid(spec.Child("terminationGracePeriodSeconds"), *g, "must be >= 0"))
	}
	return errs.ToAggregate()
}

// MakeStatic turns a decoded manifest into the static pod kubelet would run: defaults applied,
// name suffixed with the node name, bound to the node, and a UID derived from the content, the
// node and the source, so the same file gives the same pod across restarts and an edited file
// gives a new one.
func MakeStatic(pod *v1.Pod, nodeName, sourcePath string) error {
	SetDefaults(pod)
	if err := Validate(pod); err != nil {
		return err
	}
	canonical, err := yaml.Marshal(pod)
	if err != nil {
		return fmt.Errorf("hash pod: %w", err)
	}
	// The pod is written as this encoding (the state store, the mirror pod): one that does
	// not read back would be lost there. metav1.Time writes a time whose UTC year is outside
	// 0000-9999 (creationTimestamp "0000-01-01T00:00:00+01:00") and then refuses to read it.
	if _, err := Decode(canonical); err != nil {
		return fmt.Errorf("the pod does not read back once encoded (a timestamp out of range?): %w", err)
	}
	h := sha256.New()
	h.Write(canonical)
	h.Write([]byte{0})
	h.Write([]byte(nodeName))
	h.Write([]byte{0})
	h.Write([]byte(sourcePath))
	sum := hex.EncodeToString(h.Sum(nil))[:32]

	pod.Name = pod.Name + "-" + nodeName
	pod.UID = types.UID(sum)
	pod.Spec.NodeName = nodeName
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[ConfigSourceAnnotation] = SourceFile
	pod.Annotations[ConfigHashAnnotation] = sum
	return Validate(pod) // the suffixed name must still be valid
}

// IsStatic reports whether a pod came from a manifest file.
func IsStatic(pod *v1.Pod) bool {
	return pod.Annotations[ConfigSourceAnnotation] == SourceFile
}
