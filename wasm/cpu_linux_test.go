package wasm_test

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time the test process has used. Benchmarks report it
// per operation beside wall time: on a shared, loaded machine wall time
// includes waiting for a core, CPU time does not.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
}
