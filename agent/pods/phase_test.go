package pods

import (
	"log/slog"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The arrows of lifePhase's drawing, and only those, are transitions: nothing goes back, and
// every phase but the last can go to terminating.
func TestLifePhaseTransitions(t *testing.T) {
	legal := map[lifePhase][]lifePhase{
		phaseAdmitting:   {phaseRejected, phaseRunning, phaseFinishing, phaseTerminating},
		phaseRejected:    {phaseTerminating},
		phaseRunning:     {phaseFinishing, phaseTerminating},
		phaseFinishing:   {phaseFinished, phaseTerminating},
		phaseFinished:    {phaseTerminating},
		phaseTerminating: {phaseTerminated},
		phaseTerminated:  nil,
	}
	for from := phaseAdmitting; from <= phaseTerminated; from++ {
		for to := phaseAdmitting; to <= phaseTerminated; to++ {
			want := false
			for _, l := range legal[from] {
				want = want || l == to
			}
			if got := from.canMoveTo(to); got != want {
				t.Errorf("%s -> %s: legal %v, want %v", from, to, got, want)
			}
		}
	}
}

// An illegal transition is refused and leaves the phase; a termination remembers the phase it
// began in, so that a pod that had finished stays out of admission and cleaned up while it
// terminates.
func TestLifePhaseTerminationRemembersTheRun(t *testing.T) {
	m := NewManager(Config{}, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	newW := func() *worker {
		return newWorker(m, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Name: "web", Namespace: "default"}})
	}

	w := newW()
	if w.moveTo(phaseFinished) || w.phase != phaseAdmitting {
		t.Fatalf("admitting -> finished was not refused: phase %s", w.phase)
	}
	for _, p := range []lifePhase{phaseRunning, phaseFinishing, phaseFinished, phaseTerminating} {
		if !w.moveTo(p) {
			t.Fatalf("move to %s refused from %s", p, w.phase)
		}
	}
	if !w.terminalLocked() || !w.cleanedLocked() {
		t.Errorf("a finished pod that terminates: terminal %v, cleaned %v; want both", w.terminalLocked(), w.cleanedLocked())
	}
	if w.moveTo(phaseRunning) {
		t.Error("terminating -> running was not refused")
	}

	w = newW()
	w.moveTo(phaseRunning)
	w.moveTo(phaseTerminating)
	w.moveTo(phaseTerminated)
	if w.terminalLocked() || w.cleanedLocked() {
		t.Errorf("a running pod that was deleted: terminal %v, cleaned %v; want neither", w.terminalLocked(), w.cleanedLocked())
	}
	if got := w.currentPhase().String(); got != "terminated" {
		t.Errorf("phase %q", got)
	}
}
