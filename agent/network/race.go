//go:build race

package network

import "github.com/sasha-s/go-deadlock"

// Under -race (how the integration tests build the agent, and how make test builds every test
// binary) go-cni swaps its mutexes for go-deadlock's. Its detector names goroutines by
// petermattis/goid, which answers 0 for every goroutine on this Go version, so two networks set
// up at once look like one goroutine locking twice, and it exits the process. The race detector
// is what these builds are for: the lock-order heuristics stay off, and the mutexes behave as
// sync's. The setting lives here, with the package through which holdfast reaches go-cni, so
// every binary that sets networks up at once gets it: the agent, and the bench harness's boot
// floor (its concurrent CNI ADDs exited the bench test binary in CI on 2026-12-05). internal/
// testenv's test calls go-cni directly, one setup at a time.
func init() { deadlock.Opts.Disable = true }
