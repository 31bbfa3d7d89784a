package bench

import (
	"math"
	"slices"
	"time"
)

// series is a set of durations with the summaries the report shows.
type series []time.Duration

// percentile returns the nearest-rank q-th percentile (0 <= q <= 100, 0 giving the
// minimum): the smallest sample with at least q% of the samples at or below it. With 20
// samples p99 is the largest one, and the report says how many samples there were. 0 for an
// empty series.
func (s series) percentile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	rank := int(math.Ceil(q / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// millis converts for the report.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
