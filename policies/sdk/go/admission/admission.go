// Package admission exports a holdfast policy's admit entry point. A policy
// registers its function in init:
//
//	func init() { admission.Handle(validate) }
package admission

import (
	"errors"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
)

var handler func(*sdk.AdmissionRequest) sdk.AdmissionResponse

// Handle registers the policy's decision function. Call it from init.
func Handle(fn func(*sdk.AdmissionRequest) sdk.AdmissionResponse) { handler = fn }

// Evaluate runs the registered function on a JSON input, exactly as the
// admit export does. Policies use it in native unit tests.
func Evaluate(input []byte) ([]byte, error) {
	if handler == nil {
		return nil, errors.New("no admission handler: call admission.Handle in init")
	}
	req, err := sdk.DecodeAdmissionRequest(input)
	if err != nil {
		return nil, err
	}
	return handler(req).AppendJSON(make([]byte, 0, 128)), nil
}

// Deny is a convenience for a denial.
func Deny(reason, message string) sdk.AdmissionResponse {
	return sdk.AdmissionResponse{Allowed: false, Reason: reason, Message: message}
}

// Allow is a convenience for an admission, with optional warnings.
func Allow(warnings ...string) sdk.AdmissionResponse {
	return sdk.AdmissionResponse{Allowed: true, Warnings: warnings}
}
