//go:build wasip1

package probe

import sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"

//go:wasmexport probe
func probe(ptr, size uint32) uint64 {
	return sdk.Entry(ptr, size, func(in []byte) []byte {
		out, err := Evaluate(in)
		if err != nil {
			panic("probe: " + err.Error())
		}
		return out
	})
}
