// Package runtime is the contract between the pod layer and the container runtimes: the
// interfaces the pod workers run on (Runtime, Network), the description of a container they
// hand a backend (ContainerConfig), what a backend answers (Container, TaskEvent,
// ImageResult), and the errors a caller classifies with errors.Is (ErrNotFound,
// ErrImagePull, ErrCreateContainer...). It knows no runtime: each backend is a package beside
// it that implements the contract and translates the description once, into its own terms:
//
//   - agent/runtime/containerd: containerd through its Go client, in a namespace holdfast
//     owns, with its own labels as the record of what runs; a gateway's default.
//   - agent/runtime/cri: any CRI runtime (runtime: cri), which makes the pods' sandboxes.
//   - agent/runtime/hollow: records in memory, for fleet simulations (holdfast hollow).
//
// agent/runtime/runtimetest is the contract as a test suite, run by each backend's tests.
// Only agent (the wiring, backend.go) imports a backend.
package runtime
