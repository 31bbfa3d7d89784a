package podutil

import (
	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// qosResources are the resources a QoS class is computed from, in a fixed order.
var qosResources = []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory}

// PodQOS returns the QoS class in the pod's status, or ComputePodQOS's when the status has
// none.
func PodQOS(pod *v1.Pod) v1.PodQOSClass {
	if pod.Status.QOSClass != "" {
		return pod.Status.QOSClass
	}
	return ComputePodQOS(pod)
}

// ComputePodQOS returns the pod's QoS class from its resources: BestEffort when no container
// (init containers included) requests or limits cpu or memory, Guaranteed when every container
// has cpu and memory limits equal to its requests, else Burstable. Pod-level resources, when
// set, decide alone.
func ComputePodQOS(pod *v1.Pod) v1.PodQOSClass {
	if resourcehelper.IsPodLevelResourcesSet(pod) {
		return requirementsQOS(pod.Spec.Resources)
	}
	var podQOS v1.PodQOSClass
	for _, containers := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range containers {
			containerQOS := requirementsQOS(&containers[i].Resources)
			switch {
			case containerQOS == v1.PodQOSBurstable:
				return v1.PodQOSBurstable
			case podQOS == "":
				podQOS = containerQOS
			case podQOS != containerQOS:
				return v1.PodQOSBurstable // one BestEffort, another Guaranteed
			}
		}
	}
	if podQOS == "" { // no container at all
		podQOS = v1.PodQOSBestEffort
	}
	return podQOS
}

// requirementsQOS is the QoS class of one set of requirements.
func requirementsQOS(resources *v1.ResourceRequirements) v1.PodQOSClass {
	if len(resources.Requests) == 0 && len(resources.Limits) == 0 {
		return v1.PodQOSBestEffort
	}
	var qos v1.PodQOSClass
	for _, res := range qosResources {
		resQOS := resourceQOS(resources, res)
		switch {
		case resQOS == v1.PodQOSBurstable:
			return v1.PodQOSBurstable
		case qos == "":
			qos = resQOS
		case qos != resQOS:
			return v1.PodQOSBurstable // some but not all resources specified
		}
	}
	return qos
}

// resourceQOS is the class of one resource: Burstable when request and limit differ,
// BestEffort when both are zero, Guaranteed when they are equal and not zero.
func resourceQOS(resources *v1.ResourceRequirements, res v1.ResourceName) v1.PodQOSClass {
	req := resources.Requests[res]
	lim := resources.Limits[res]
	switch {
	case !req.Equal(lim):
		return v1.PodQOSBurstable
	case req.IsZero():
		return v1.PodQOSBestEffort
	default:
		return v1.PodQOSGuaranteed
	}
}
