//go:build race

package main

import "github.com/sasha-s/go-deadlock"

// Under -race (how the integration tests build the agent) go-cni swaps its mutexes for
// go-deadlock's. Its detector names goroutines by petermattis/goid, which answers 0 for every
// goroutine on this Go version, so two pods' networks set up at once look like one goroutine
// locking twice, and it exits the agent. The race detector is what these builds are for: the
// lock-order heuristics stay off, and the mutexes behave as sync's.
func init() { deadlock.Opts.Disable = true }
