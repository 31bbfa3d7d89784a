package sdk

import (
	"encoding/json"
	"fmt"
)

// ABIVersion is the version of policies/ABI.md this SDK implements.
const ABIVersion = 1

// Pod holds the fields of a Kubernetes v1.Pod that policies commonly need.
// The full object is available from the request's RawPod method.
type Pod struct {
	APIVersion string     `json:"apiVersion,omitempty"`
	Kind       string     `json:"kind,omitempty"`
	Metadata   ObjectMeta `json:"metadata"`
	Spec       PodSpec    `json:"spec"`
}

// ObjectMeta is the metadata of a pod.
type ObjectMeta struct {
	Name        string            `json:"name,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	UID         string            `json:"uid,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PodSpec is the part of a pod's spec policies commonly look at.
type PodSpec struct {
	NodeName            string              `json:"nodeName,omitempty"`
	HostNetwork         bool                `json:"hostNetwork,omitempty"`
	HostPID             bool                `json:"hostPID,omitempty"`
	HostIPC             bool                `json:"hostIPC,omitempty"`
	ServiceAccountName  string              `json:"serviceAccountName,omitempty"`
	SecurityContext     *PodSecurityContext `json:"securityContext,omitempty"`
	InitContainers      []Container         `json:"initContainers,omitempty"`
	Containers          []Container         `json:"containers,omitempty"`
	EphemeralContainers []Container         `json:"ephemeralContainers,omitempty"`
	Volumes             []Volume            `json:"volumes,omitempty"`
}

// AllContainers returns init, regular and ephemeral containers, in that order.
func (s *PodSpec) AllContainers() []Container {
	out := make([]Container, 0, len(s.InitContainers)+len(s.Containers)+len(s.EphemeralContainers))
	out = append(out, s.InitContainers...)
	out = append(out, s.Containers...)
	return append(out, s.EphemeralContainers...)
}

// Container returns the container (of any kind) named name, or nil.
func (s *PodSpec) Container(name string) *Container {
	for _, list := range [][]Container{s.Containers, s.InitContainers, s.EphemeralContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// PodSecurityContext is the pod-level security context.
type PodSecurityContext struct {
	RunAsUser    *int64 `json:"runAsUser,omitempty"`
	RunAsNonRoot *bool  `json:"runAsNonRoot,omitempty"`
}

// Container is one container of a pod.
type Container struct {
	Name            string               `json:"name"`
	Image           string               `json:"image,omitempty"`
	Command         []string             `json:"command,omitempty"`
	Args            []string             `json:"args,omitempty"`
	Ports           []ContainerPort      `json:"ports,omitempty"`
	Resources       ResourceRequirements `json:"resources,omitempty"`
	SecurityContext *SecurityContext     `json:"securityContext,omitempty"`
}

// ContainerPort is a port a container declares.
type ContainerPort struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
}

// ResourceRequirements holds quantities as the API writes them ("500m",
// "128Mi"); see ParseQuantity.
type ResourceRequirements struct {
	Limits   map[string]string `json:"limits,omitempty"`
	Requests map[string]string `json:"requests,omitempty"`
}

// SecurityContext is a container's security context.
type SecurityContext struct {
	Privileged               *bool         `json:"privileged,omitempty"`
	AllowPrivilegeEscalation *bool         `json:"allowPrivilegeEscalation,omitempty"`
	RunAsUser                *int64        `json:"runAsUser,omitempty"`
	RunAsNonRoot             *bool         `json:"runAsNonRoot,omitempty"`
	ReadOnlyRootFilesystem   *bool         `json:"readOnlyRootFilesystem,omitempty"`
	Capabilities             *Capabilities `json:"capabilities,omitempty"`
}

// Capabilities are Linux capabilities added and dropped.
type Capabilities struct {
	Add  []string `json:"add,omitempty"`
	Drop []string `json:"drop,omitempty"`
}

// Volume is a pod volume; only hostPath is modelled, see RawPod for others.
type Volume struct {
	Name     string                `json:"name"`
	HostPath *HostPathVolumeSource `json:"hostPath,omitempty"`
}

// HostPathVolumeSource is a hostPath volume.
type HostPathVolumeSource struct {
	Path string `json:"path"`
	Type string `json:"type,omitempty"`
}

// Node describes the node judging the pod.
type Node struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	// Allocatable holds quantities by resource name ("cpu", "memory", "pods").
	Allocatable map[string]string `json:"allocatable,omitempty"`
}

// AdmissionRequest is the input of admit.
type AdmissionRequest struct {
	Pod      Pod             `json:"pod"`
	Node     Node            `json:"node"`
	Settings json.RawMessage `json:"settings,omitempty"`
	input    []byte
}

// RawPod returns the pod's JSON as the host sent it, for fields Pod does not
// model. It scans the input again; decoding the raw pod with encoding/json
// costs far more than the request's own decoding, so do it only when needed.
func (r *AdmissionRequest) RawPod() (json.RawMessage, error) { return rawPod(r.input) }

// AdmissionResponse is the output of admit.
type AdmissionResponse struct {
	Allowed bool `json:"allowed"`
	// Reason is a short CamelCase word for the pod's status (e.g.
	// "RegistryNotAllowed"); the host uses "PolicyDenied" if empty.
	Reason   string   `json:"reason,omitempty"`
	Message  string   `json:"message,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

// ProbeRequest is the input of probe.
type ProbeRequest struct {
	Pod       Pod    `json:"pod"`
	Container string `json:"container"`
	PodIP     string `json:"podIP"`
	// Ports are the ports the host lets the probe reach on PodIP.
	Ports    []int           `json:"ports,omitempty"`
	Settings json.RawMessage `json:"settings,omitempty"`
	input    []byte
}

// RawPod returns the pod's JSON as the host sent it; see
// AdmissionRequest.RawPod.
func (r *ProbeRequest) RawPod() (json.RawMessage, error) { return rawPod(r.input) }

func rawPod(input []byte) (json.RawMessage, error) { return rawMember(input, "pod") }

// ProbeResponse is the output of probe.
type ProbeResponse struct {
	Success bool   `json:"success"`
	Message string `json:"message,omitempty"`
}

// DecodeAdmissionRequest parses admit's input, as encoding/json would into
// AdmissionRequest but without reflection (see decode.go). The input must
// stay unchanged while the request is used (RawPod reads it).
func DecodeAdmissionRequest(b []byte) (*AdmissionRequest, error) {
	r := AdmissionRequest{input: b}
	if err := decodeAdmissionRequest(b, &r); err != nil {
		return nil, fmt.Errorf("admission request: %w", err)
	}
	return &r, nil
}

// DecodeProbeRequest parses probe's input; see DecodeAdmissionRequest.
func DecodeProbeRequest(b []byte) (*ProbeRequest, error) {
	r := ProbeRequest{input: b}
	if err := decodeProbeRequest(b, &r); err != nil {
		return nil, fmt.Errorf("probe request: %w", err)
	}
	return &r, nil
}

// DecodeSettings decodes the policy's settings into v, rejecting unknown
// fields so that a typo in the node's configuration is an error, not a
// silently ignored setting. Missing settings leave v unchanged.
func DecodeSettings(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytesReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
