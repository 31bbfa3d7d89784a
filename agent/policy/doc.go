// Package policy is the agent's adapter to WebAssembly policies: it reads the
// node's policy configuration, keeps the modules loaded in a wasm.Engine,
// reloads them when their files change, and answers the two questions the
// agent asks:
//
//   - Admit(ctx, pod, node): may this pod run here? All admission policies
//     (kinds admission and opa) are asked, in the order of the
//     configuration; the first denial wins.
//   - Probe(ctx, policy, target): is this container healthy, by the probe
//     policy named in the pod's annotation (see ParseProbeAnnotations)?
//
// The configuration is one file, policies.yaml, in a policies directory:
//
//	apiVersion: holdfast.dev/v1alpha1
//	kind: PolicyConfig
//	policies:
//	- name: allowed-registries
//	  kind: admission
//	  module: allowed-registries.wasm   # relative to the directory
//	  failurePolicy: Fail               # or Ignore: what a module error means
//	  settings: {registries: [docker.io/library, registry.local:5000]}
//	  limits: {timeout: 2s, memory: 64Mi}
//	- name: registries-rego
//	  kind: opa                         # Rego, as opa build -t wasm wrote it (opa.go)
//	  module: registries.tar.gz
//	  entrypoint: kubernetes/admission/deny
//	- name: collector-health
//	  kind: probe
//	  module: http-json.wasm
//	  grants: {http: true}
//	  settings: {port: 8080, path: /healthz, field: status, equals: ok}
//
// A module may instead come from a registry, pinned by its manifest digest
// (module: oci://registry.example:5000/policies/x@sha256:...): oci.go pulls and
// verifies it, ocipull.go pulls it in the background into the agent's state
// store (Options.Modules), from which every load reads it, offline too.
//
// The package knows pods (k8s.io/api) but not containerd, client-go or the
// agent's loop: the agent hands it a pod and gets a Decision back.
package policy
