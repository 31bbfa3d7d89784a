// Package record is client-go's tools/record (k8s.io/client-go v0.37.2, Apache License 2.0, the
// Kubernetes Authors: the files keep their license headers): the event broadcaster, recorder
// and correlator (aggregation, deduplication by count, spam filter) the agent records its
// events with, as the kubelet does.
//
// client-go's package computes the correlator's patch of a repeated event (its count, last
// time and message) with apimachinery's strategicpatch, which links the OpenAPI models,
// about 2 MiB of the agent's binary (issue 31). The changes: that patch computed by
// agent/kube/patch (the same bytes: only those top-level fields differ); the adapter to the
// events.k8s.io recorder interface (client-go internal) left out; tools/record/util's three
// helpers unexported in util.go (its test not kept: it tests the name generator's uuid fallback
// only).
package record
