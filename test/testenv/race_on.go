//go:build race

package testenv

// raceEnabled is true when the test binary runs under the race detector: the agent it starts is
// then built with -race too, so that the detector sees the agent's own concurrency, not only the
// test's.
const raceEnabled = true
