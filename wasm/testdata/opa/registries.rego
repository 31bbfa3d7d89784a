# The allowed-registries example (policies/examples/admission/allowed-registries) in Rego:
# every container's and init container's image must come from one of data.registries. The
# benchmarks evaluate it on input.json (the AdmissionReview of a 2 KB pod) in holdfast's engine
# (BenchmarkAdmit/opa) and with OPA's Go evaluator (opa bench, in make bench).
package holdfast.admission

import rego.v1

deny contains msg if {
	some c in array.concat(object.get(input.request.object.spec, "initContainers", []), input.request.object.spec.containers)
	not allowed(c.image)
	msg := sprintf("container %q uses image %q, which is not from the allowed registries %v", [c.name, c.image, data.registries])
}

allowed(image) if {
	some r in data.registries
	startswith(image, concat("", [r, "/"]))
}
