package pods

import (
	"strings"
	"testing"
	"time"
)

// RelistHealthy fails, with kubelet's PLEG message naming the threshold, once the configured
// RelistThreshold has passed since the last relist; kubelet's 3m when none is configured.
func TestRelistHealthyThreshold(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	for _, tc := range []struct {
		threshold, since time.Duration
		wantErr          string
	}{
		{5 * time.Second, 4 * time.Second, ""},
		{5 * time.Second, 6 * time.Second, "PLEG is not healthy: pleg was last seen active 6s ago; threshold is 5s"},
		{0, 179 * time.Second, ""},
		{0, 181 * time.Second, "PLEG is not healthy: pleg was last seen active 3m1s ago; threshold is 3m0s"},
	} {
		m := NewManager(Config{RelistThreshold: tc.threshold, Now: clock}, nil, nil, nil, nil, nil)
		if err := m.RelistHealthy(); err == nil || !strings.Contains(err.Error(), "not relisted yet") {
			t.Errorf("before any relist: %v", err)
		}
		m.lastRelist = now.Add(-tc.since)
		err := m.RelistHealthy()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("threshold %s, %s since the relist: %v", tc.threshold, tc.since, err)
		case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
			t.Errorf("threshold %s, %s since the relist: %v, want %q", tc.threshold, tc.since, err, tc.wantErr)
		}
	}
}

// A relist asked for sooner than the one due moves it earlier; one asked for later leaves it;
// a relist that begins sets the next a period ahead, whatever was asked before it.
func TestRelistRequests(t *testing.T) {
	m := NewManager(Config{}, nil, nil, nil, nil, nil)
	if d := m.untilRelist(); d > 0 {
		t.Fatalf("before the first relist: due in %s, want now", d)
	}
	m.scheduleRelist(time.Hour)
	if d := m.untilRelist(); d <= 59*time.Minute {
		t.Fatalf("after a relist with an hour's period: due in %s", d)
	}
	m.requestRelist(2 * time.Hour)
	if d := m.untilRelist(); d <= 59*time.Minute || d > time.Hour {
		t.Errorf("a later request moved the relist: due in %s", d)
	}
	m.requestRelist(time.Second)
	if d := m.untilRelist(); d > time.Second {
		t.Errorf("a relist asked for within a second: due in %s", d)
	}
	select {
	case <-m.relistCh:
	default:
		t.Error("the relist loop was not woken up")
	}
	m.requestRelist(0)
	if d := m.untilRelist(); d > 0 {
		t.Errorf("a relist asked for now: due in %s", d)
	}
	m.scheduleRelist(time.Hour)
	if d := m.untilRelist(); d <= 59*time.Minute {
		t.Errorf("the relist that begins sets the next an hour ahead: due in %s", d)
	}
}
