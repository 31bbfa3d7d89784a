//go:build wasip1

package admission

import sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"

//go:wasmexport admit
func admit(ptr, size uint32) uint64 {
	return sdk.Entry(ptr, size, func(in []byte) []byte {
		out, err := Evaluate(in)
		if err != nil {
			// A trap: the host applies the policy's failurePolicy.
			panic("admit: " + err.Error())
		}
		return out
	})
}
