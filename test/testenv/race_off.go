//go:build !race

package testenv

// raceEnabled is true when the test binary runs under the race detector (see race_on.go).
const raceEnabled = false
