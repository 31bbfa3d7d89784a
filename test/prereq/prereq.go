// Package prereq is what a test needs of the machine it runs on (root, netfilter, a tmpfs
// mount, a device node): a test that lacks it fails, saying what is missing, because a test
// that skips can pass without having run. `make test` runs as root on a machine it has
// provisioned (hack/deps.sh), so there it has all of them. Under -short (make test-short, the
// unit tests alone) such tests skip: they are integration tests there.
package prereq

import (
	"os"
	"testing"
)

// Root fails t (skips it under -short) unless the test runs as root; why says what for.
func Root(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs root (%s): an integration test, skipped under -short", why)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("needs root (%s): run the tests as root, as make test does", why)
	}
}

// NoError fails t (skips it under -short) when err, the outcome of setting up what the test
// needs of the machine (what: "iptables", "mount a tmpfs"), is not nil.
func NoError(t testing.TB, err error, what string) {
	t.Helper()
	if err == nil {
		return
	}
	if testing.Short() {
		t.Skipf("%s: %v: an integration test, skipped under -short", what, err)
	}
	t.Fatalf("%s, which this test needs of the machine: %v (make test runs as root on a machine hack/deps.sh provisioned)", what, err)
}
