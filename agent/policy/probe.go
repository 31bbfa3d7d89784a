package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/wasm"
)

// ProbeTarget is the container a probe policy judges, and what the policy
// may reach of it.
type ProbeTarget struct {
	Pod       *corev1.Pod
	Container string
	// PodIP is the only address http and tcp grants may reach.
	PodIP string
	// Ports are the ports they may reach on PodIP: the pod's declared
	// container ports (the agent may add others).
	Ports []int32
	// RootFS is the host path of the container's root filesystem, seen by
	// the policy at "/". Files grants are read there.
	RootFS string
	// Mounts are the container's volumes: files under ContainerPath are read
	// from HostPath instead of RootFS.
	Mounts []Mount
}

// Mount maps a container path to a host directory.
type Mount struct {
	ContainerPath string
	HostPath      string
}

// probeInput is the ABI's probe input.
type probeInput struct {
	Pod       *corev1.Pod     `json:"pod"`
	Container string          `json:"container"`
	PodIP     string          `json:"podIP"`
	Ports     []int32         `json:"ports"`
	Settings  json.RawMessage `json:"settings"`
}

// probeOutput is the ABI's probe output.
type probeOutput struct {
	Success *bool  `json:"success"`
	Message string `json:"message"`
}

// decodeProbeOutput reads what probe returned: a JSON object with a boolean "success".
func decodeProbeOutput(out []byte) (probeOutput, error) {
	var res probeOutput
	err := decodeOutput(out, map[string]any{"success": &res.Success, "message": &res.Message})
	if err != nil || res.Success == nil {
		return probeOutput{}, fmt.Errorf("output %.100q is not a probe result ({\"success\": true|false, ...})", out)
	}
	return res, nil
}

// Probe runs the probe policy named policyName on target. The caller bounds
// ctx with the probe's timeoutSeconds; the policy's limits.timeout applies
// too. A policy error (trap, timeout, not loaded, unknown policy) returns
// err with success false under failurePolicy Fail, and success true with a
// message under Ignore. The message is meant for the probe's event.
func (m *Manager) Probe(ctx context.Context, policyName string, target ProbeTarget) (success bool, message string, err error) {
	l, ok := m.current.Load().byName[policyName]
	if !ok {
		return false, "", fmt.Errorf("no policy %q in %s", policyName, ConfigFileName)
	}
	if l.cfg.Kind != KindProbe {
		return false, "", fmt.Errorf("policy %q is an %s policy, not a probe policy", policyName, l.cfg.Kind)
	}
	input, err := json.Marshal(probeInput{
		Pod:       target.Pod,
		Container: target.Container,
		PodIP:     target.PodIP,
		Ports:     target.Ports,
		Settings:  settingsOf(l.cfg),
	})
	if err != nil {
		return false, "", fmt.Errorf("encode probe input: %w", err)
	}
	var opts []wasm.CallOption
	if target.PodIP != "" && len(target.Ports) > 0 {
		ports := make([]int, len(target.Ports))
		for i, p := range target.Ports {
			ports[i] = int(p)
		}
		opts = append(opts, wasm.WithNetwork(target.PodIP, ports...))
	}
	if len(l.cfg.Grants.Files) > 0 {
		var mounts []wasm.FileMount
		if target.RootFS != "" {
			mounts = append(mounts, wasm.FileMount{GuestPath: "/", HostPath: target.RootFS})
		}
		for _, mt := range target.Mounts {
			mounts = append(mounts, wasm.FileMount{GuestPath: mt.ContainerPath, HostPath: mt.HostPath})
		}
		opts = append(opts, wasm.WithFiles(l.cfg.Grants.Files, mounts...))
	}
	began := time.Now()
	out, l, err := m.call(ctx, l, "probe", input, opts...)
	var res probeOutput
	if err == nil {
		if res, err = decodeProbeOutput(out); err != nil {
			err = fmt.Errorf("policy %q: %w", policyName, err)
		}
	}
	m.observe(l, evaluationResult(err, res.Success, "success", "failure"), began)
	if err != nil {
		if l.cfg.FailurePolicy == Ignore {
			return true, clip(fmt.Sprintf("probe policy %q failed and was ignored (failurePolicy Ignore): %v", policyName, err)), nil
		}
		return false, clip(fmt.Sprintf("probe policy %q (module %s) failed: %v", policyName, digestOrNone(l), err)), err
	}
	return *res.Success, clip(res.Message), nil
}
