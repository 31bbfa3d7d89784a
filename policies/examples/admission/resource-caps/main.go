// Command resource-caps is a holdfast admission policy: it denies a pod whose
// containers together may use more than a cap (the sum of their limits, or
// of their requests where a limit is missing), and optionally a pod with a
// container that sets no limit at all.
//
// Settings:
//
//	maxCPU: "2"              # per pod, Kubernetes quantity
//	maxMemory: "1Gi"         # per pod
//	requireLimits: true      # every container must set cpu and memory limits
//	maxFractionOfNode: 0.5   # optional: also cap at this fraction of the node's allocatable
package main

import (
	"fmt"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/admission"
)

type settings struct {
	MaxCPU            string  `json:"maxCPU"`
	MaxMemory         string  `json:"maxMemory"`
	RequireLimits     bool    `json:"requireLimits"`
	MaxFractionOfNode float64 `json:"maxFractionOfNode"`
}

func init() { admission.Handle(validate) }

func main() {}

func validate(req *sdk.AdmissionRequest) sdk.AdmissionResponse {
	var s settings
	if err := sdk.DecodeSettings(req.Settings, &s); err != nil {
		return admission.Deny("InvalidSettings", "resource-caps: settings: "+err.Error())
	}
	var warnings []string
	var cpu, mem int64 // milli-units
	for _, c := range req.Pod.Spec.Containers {
		for _, res := range []string{"cpu", "memory"} {
			q, ok := c.Resources.Limits[res]
			if !ok {
				if s.RequireLimits {
					return admission.Deny("LimitRequired", fmt.Sprintf("container %q sets no %s limit", c.Name, res))
				}
				q, ok = c.Resources.Requests[res]
				if !ok {
					warnings = append(warnings, fmt.Sprintf("container %q sets no %s limit or request; it is not counted", c.Name, res))
					continue
				}
			}
			v, err := sdk.ParseQuantity(q)
			if err != nil {
				return admission.Deny("InvalidResources", fmt.Sprintf("container %q: %s: %v", c.Name, res, err))
			}
			if res == "cpu" {
				cpu += v
			} else {
				mem += v
			}
		}
	}
	check := func(res string, used int64, limitQ string, unit func(int64) string) *sdk.AdmissionResponse {
		if limitQ == "" {
			return nil
		}
		limit, err := sdk.ParseQuantity(limitQ)
		if err != nil {
			r := admission.Deny("InvalidSettings", fmt.Sprintf("resource-caps: max %s %q: %v", res, limitQ, err))
			return &r
		}
		if used > limit {
			r := admission.Deny("ResourceCapExceeded", fmt.Sprintf("the pod may use %s of %s, over the cap of %s", unit(used), res, unit(limit)))
			return &r
		}
		return nil
	}
	milliCPU := func(v int64) string { return fmt.Sprintf("%dm", v) }
	bytes := func(v int64) string { return fmt.Sprintf("%dMi", v/1000/(1<<20)) }
	if r := check("cpu", cpu, s.MaxCPU, milliCPU); r != nil {
		return *r
	}
	if r := check("memory", mem, s.MaxMemory, bytes); r != nil {
		return *r
	}
	if f := s.MaxFractionOfNode; f > 0 {
		for res, used := range map[string]int64{"cpu": cpu, "memory": mem} {
			q, ok := req.Node.Allocatable[res]
			if !ok {
				continue
			}
			alloc, err := sdk.ParseQuantity(q)
			if err != nil {
				continue
			}
			if float64(used) > f*float64(alloc) {
				return admission.Deny("ResourceCapExceeded", fmt.Sprintf("the pod may use %s of %s, over %.0f%% of the node's allocatable %s", res, fmtQ(res, used), f*100, q))
			}
		}
	}
	return admission.Allow(warnings...)
}

func fmtQ(res string, v int64) string {
	if res == "cpu" {
		return fmt.Sprintf("%dm", v)
	}
	return fmt.Sprintf("%dMi", v/1000/(1<<20))
}
