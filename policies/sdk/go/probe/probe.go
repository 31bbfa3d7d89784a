// Package probe exports a holdfast policy's probe entry point. A policy
// registers its function in init:
//
//	func init() { probe.Handle(check) }
package probe

import (
	"errors"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
)

var handler func(*sdk.ProbeRequest) sdk.ProbeResponse

// Handle registers the probe function. Call it from init.
func Handle(fn func(*sdk.ProbeRequest) sdk.ProbeResponse) { handler = fn }

// Evaluate runs the registered function on a JSON input, exactly as the
// probe export does. Policies use it in native unit tests.
func Evaluate(input []byte) ([]byte, error) {
	if handler == nil {
		return nil, errors.New("no probe handler: call probe.Handle in init")
	}
	req, err := sdk.DecodeProbeRequest(input)
	if err != nil {
		return nil, err
	}
	return handler(req).AppendJSON(make([]byte, 0, 128)), nil
}

// Success is a convenience for a passing probe.
func Success(message string) sdk.ProbeResponse {
	return sdk.ProbeResponse{Success: true, Message: message}
}

// Failure is a convenience for a failing probe.
func Failure(message string) sdk.ProbeResponse {
	return sdk.ProbeResponse{Success: false, Message: message}
}
