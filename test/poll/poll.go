// Package poll waits in tests for a condition to become true, with a deadline: the one helper
// behind the unit tests' waits and test/testenv's Eventually. A test never sleeps for a fixed
// time to wait for something; it polls what it waits for, and fails saying what did not
// happen and why.
package poll

import (
	"testing"
	"time"
)

// Until calls cond at once, then every interval, until it returns nil. When timeout passes
// first, it fails the test (t.Fatalf, so call it from the test's goroutine) with what and
// cond's last error.
func Until(t testing.TB, timeout, interval time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, timeout, err)
		}
		time.Sleep(interval)
	}
}

// errNotYet is what UntilTrue reports of a condition that never held.
type errNotYet struct{}

func (errNotYet) Error() string { return "still false" }

// UntilTrue is Until for a condition that has nothing to say when it does not hold.
func UntilTrue(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	Until(t, timeout, interval, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet{}
	})
}
