package offline

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkPutPod measures recording a pod: changed (a real, fsynced
// write), unchanged (skipped after a read, no write transaction), and
// changed from many goroutines (group commit shares fsyncs).
func BenchmarkPutPod(b *testing.B) {
	b.Run("changed", func(b *testing.B) {
		s := newTestBolt(b)
		pod := testPod("uid-1", "web")
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			pod.ResourceVersion = strconv.Itoa(i)
			if err := s.PutPod(SourceAPI, pod); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(s.Stats().Commits)/float64(b.N), "commits/op")
	})
	b.Run("unchanged", func(b *testing.B) {
		s := newTestBolt(b)
		pod := testPod("uid-1", "web")
		if err := s.PutPod(SourceAPI, pod); err != nil {
			b.Fatal(err)
		}
		before := s.Stats()
		b.ReportAllocs()
		for b.Loop() {
			if err := s.PutPod(SourceAPI, pod); err != nil {
				b.Fatal(err)
			}
		}
		if st := s.Stats(); st.Commits != before.Commits {
			b.Fatalf("unchanged puts committed %d transactions", st.Commits-before.Commits)
		}
	})
	b.Run("changed-parallel", func(b *testing.B) {
		s := newTestBolt(b)
		var next atomic.Int64
		b.SetParallelism(8)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			uid := fmt.Sprintf("uid-%d", next.Add(1))
			pod := testPod(uid, uid)
			for i := 0; pb.Next(); i++ {
				pod.ResourceVersion = strconv.Itoa(i)
				if err := s.PutPod(SourceAPI, pod); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(s.Stats().Commits)/float64(b.N), "commits/op")
	})
}
