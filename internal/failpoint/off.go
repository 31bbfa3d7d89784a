//go:build !failpoints

package failpoint

// Enabled says whether this binary was built with -tags failpoints.
const Enabled = false

// Inject does nothing: this binary was built without -tags failpoints.
func Inject(name string) {}
