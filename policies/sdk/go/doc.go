// Package sdk is the Go SDK for holdfast policies: WebAssembly modules that
// admit pods and probe containers on a holdfast node (see policies/ABI.md).
//
// A policy is a main package built as a reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o policy.wasm .
//
// It registers its handler in init (main is never called in a reactor):
//
//	func init() { admission.Handle(validate) }
//	func main() {}
//
// The sdk package itself holds the input and output types, the host
// functions (Log, HTTPRequest, TCPDial, ReadFile, StatFile) and the ABI's
// memory exports; the admission and probe packages export the entry points.
// Importing only one of them keeps the module's exports to what it
// implements. A host function the module does not call is not imported, so
// it needs no grant.
//
// The package has no dependency outside the standard library and none on
// k8s.io: the few Pod fields policies need are defined here, and the full
// pod JSON is available from the request's RawPod method for the rest.
//
// Performance: requests are decoded and responses encoded by hand, without
// encoding/json's reflection (decode.go, encode.go). On amd64 an admission
// call of a 2 KB pod costs about 0.12 ms of CPU, most of it decoding the
// request (Go's wasm code runs about 6 times slower than native), against
// about 7 us for the C example. A policy's own encoding/json (settings,
// RawPod, host function answers) costs more: use it where needed only.
//
// Off wasip1 (in `go test` on the developer's machine) the same code
// compiles; host functions go to the Host set with SetHost, so a policy's
// logic can be unit-tested natively.
package sdk
